"""Fuzz every operation of the live OpenAPI with schemathesis: serve with the launcher's Supervisor on
free ports (the model `make run` serves, or MODEL / MODEL_DIR), then `st run` with positive and
negative examples. No answer may be a 5xx, none may take longer than `--request-timeout` (a hang),
and every status must be one the OpenAPI documents.

    python -m client.fuzz --examples 1000        # `make fuzz` (FUZZ_EXAMPLES)

Generation is capped by the engine's `max_seq_len` (`--max-seq-len`, 256 by default), so requests
that ask for "as many tokens as fit" stay short. `make test` runs a bounded version of the same
check (tests/e2e/test_ops.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from client.served import supervised

CHECKS = "not_a_server_error,status_code_conformance"


def schemathesis(url: str, args: argparse.Namespace, report: Path) -> int:
    """st's exit status; it prints the cases generated and passed, and any failure reproduced."""
    st = Path(sys.executable).parent / "st"
    command = [
        str(st), "run", f"{url}/openapi.json", "--checks", CHECKS, "--mode", "all",
        "--max-examples", str(args.examples), "--workers", str(args.workers),
        "--request-timeout", str(args.request_timeout), "--seed", str(args.seed), "--no-color",
        "--report", "junit", "--report-junit-path", str(report),
    ]  # fmt: skip
    return subprocess.run(command, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m client.fuzz", description=__doc__)
    parser.add_argument("--examples", type=int, default=1000, help="examples per operation")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--request-timeout", type=float, default=120, help="seconds; longer is a hang")
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument("--max-seq-len", type=int, default=256)
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITONLM_MAX_SEQ_LEN", str(args.max_seq_len))
    with supervised("fuzz") as supervisor:
        report = supervisor.log_dir / "fuzz-junit.xml"
        report.unlink(missing_ok=True)
        start = time.monotonic()
        code = schemathesis(f"http://127.0.0.1:{supervisor.ports.frontend}", args, report)
        minutes = (time.monotonic() - start) / 60
    print(f"fuzz: {'PASS' if code == 0 else 'FAIL'}: {args.examples} examples per operation, "
          f"{minutes:.1f} min (JUnit report: {report})", flush=True)  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main())
