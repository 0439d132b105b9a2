"""Two checkouts' engine steps, A/B: `client.step_bench` run alternately from each (A B B A A B …),
each process for `--rounds` rounds, and the medians over every round of each side.

    python -m client.step_ab BEFORE_CHECKOUT [AFTER_CHECKOUT (default: this one)] [--alternations 4]
        [--configs models/bench:float32 models/bench:bfloat16 …] [--rounds 3]

A checkout is a directory with the project's code (a `git worktree add` of the revision to compare);
each process runs with that directory first on PYTHONPATH and this checkout's interpreter, and model
paths are read from the current directory. The machine drifts minute to minute, so only the
alternated medians compare; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROUND = re.compile(r"round \d+: '[^']*': prefill ([\d.]+) ms, decode ([\d.]+) ms")
DEFAULT_CONFIGS = [
    "models/bench:float32",
    "models/bench:bfloat16",
    "models/smollm2-135m-instruct:float32",
    "models/smollm2-135m-instruct:bfloat16",
]


def rounds(checkout: Path, model: str, dtype: str, count: int) -> list[tuple[float, float]]:
    """(prefill ms, decode step ms) of each round of one step_bench process run from `checkout`."""
    command = [sys.executable, "-m", "client.step_bench", "--model-dir", str(Path(model).resolve())]
    command += ["--dtype", dtype, "--rounds", str(count)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"step_bench failed in {checkout}:\n{done.stderr[-3000:]}")
    return [(float(p), float(d)) for p, d in ROUND.findall(done.stdout)]


def compare(a: Path, b: Path, model: str, dtype: str, alternations: int, count: int) -> str:
    got: dict[Path, list[tuple[float, float]]] = {a: [], b: []}
    for i in range(alternations):
        for side in (a, b) if i % 2 == 0 else (b, a):
            got[side].extend(rounds(side, model, dtype, count))
    (pa, da), (pb, db) = ([statistics.median(col) for col in zip(*got[s], strict=True)] for s in (a, b))
    return (
        f"{model} {dtype}, {len(got[a])} rounds a side: decode step {da:.2f} → {db:.2f} ms "
        f"({db / da:.3f}x), prefill {pa:.0f} → {pb:.0f} ms ({pb / pa:.3f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--alternations", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="MODEL_DIR:DTYPE each")
    args = parser.parse_args()
    for config in args.configs:
        model, _, dtype = config.rpartition(":")
        before, after = args.before.resolve(), args.after.resolve()
        print(compare(before, after, model, dtype, args.alternations, args.rounds))


if __name__ == "__main__":
    main()
