"""Our C++ CPU kernels: the `cpu_paged` backend's attention (`csrc/cpu_attention.cpp`) and the
decoder layer's elementwise kernels (`csrc/cpu_layer_ops.cpp`, used by `worker/fused.py` and
`worker/model_paths/decoder_stack.py`) and the projection at a few rows (`csrc/cpu_gemv.cpp`, the
`gemv` linear method) and of GGUF's Q8_0 and Q6_K blocks (`csrc/cpu_gguf.cpp`, the `gguf` linear
method) and a decode step's decoder layers in one call (`csrc/cpu_decoder_layers.cpp`,
`model_paths/layers_call.py`), in one library built ahead of time and loaded when used.

`make setup` builds it (`python -m tritonlm.worker.cpu_kernels`, through
`tritonlm/setup.py`) with `torch.utils.cpp_extension` into `build/cpu_attention/`, beside a
fingerprint of the sources and the torch version it was built for; nothing is compiled at run time.
`kernels()` loads it once and gives its ops (`torch.ops.tritonlm_cpu`), or says why they cannot run
here (`unavailable`): not built, built from another source or torch, or a CPU (or
`ATEN_CPU_CAPABILITY`) without AVX-512. Each kernel holds a plain C++ loop too, which the tests
compare with the AVX-512 one; the backend and the layer ops are used only with AVX-512.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "csrc" / name
    for name in (
        "cpu_vector.h",
        "cpu_attention.cpp",
        "cpu_layer_ops.cpp",
        "cpu_gemv.cpp",
        "cpu_gguf.cpp",
        "cpu_decoder_layers.cpp",
    )
]
BUILD_DIR = ROOT / "build" / "cpu_attention"
NAME = "tritonlm_cpu_attention"
LIBRARY = BUILD_DIR / f"{NAME}.so"
FINGERPRINT = BUILD_DIR / "fingerprint"
# No -march: the AVX-512 loops have their own target attribute, chosen at run time. -fopenmp: without
# it at::parallel_for compiles to a serial loop (torch's threads are OpenMP's; the library then
# links the libgomp torch has loaded). -ffp-contract=off: no product and sum fused into one rounding
# where torch rounds twice (the rotary embedding's products and their sum).
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]


def fingerprint() -> str:
    """What the built library must have been built from: these sources, these flags, this torch."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    digest.update(" ".join([*CFLAGS, torch.__version__]).encode())
    return digest.hexdigest()


def built() -> bool:
    return (
        all(source.exists() for source in SOURCES)
        and LIBRARY.exists()
        and FINGERPRINT.exists()
        and FINGERPRINT.read_text() == fingerprint()
    )


def build() -> Path:
    """Builds the library unless it is built already for this source and torch; returns its path."""
    if built():
        return LIBRARY
    from torch.utils import cpp_extension

    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    FINGERPRINT.unlink(missing_ok=True)
    # cpp_extension runs `ninja` from PATH: the one pinned in this environment, even when not active.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    cpp_extension.load(
        name=NAME,
        sources=[str(source) for source in SOURCES if source.suffix == ".cpp"],
        extra_cflags=CFLAGS,
        extra_ldflags=["-fopenmp"],
        build_directory=str(BUILD_DIR),
        is_python_module=False,
        verbose=False,
    )
    FINGERPRINT.write_text(fingerprint())
    return LIBRARY


@functools.cache
def _load() -> tuple[object | None, str]:
    if not built():
        missing = [str(source) for source in SOURCES if not source.exists()]
        if missing:
            return None, f"its sources {', '.join(missing)} are missing"
        why = "not built" if not LIBRARY.exists() else "built from another source or torch"
        return None, f"{LIBRARY} is {why} (run `make setup`)"
    try:
        torch.ops.load_library(str(LIBRARY))
    except (OSError, RuntimeError) as error:
        return None, f"{LIBRARY} does not load: {error}"
    return torch.ops.tritonlm_cpu, ""


_OPS: object | None = None  # the loaded ops, a plain global: torch.compile reads it as a constant


def kernels() -> object:
    """The kernels' ops (`paged_attention`, `rms_norm`, `silu_and_mul`, `add_rms_norm`, `rotary`,
    `gemv`, `gguf_gemv`, `gguf_dequantize`, `has_vector_path`, `has_bf16_dot`); call only when
    `unavailable()` is None."""
    global _OPS
    if _OPS is None:
        ops, why = _load()
        assert ops is not None, why
        _OPS = ops
    return _OPS


def unavailable() -> str | None:
    """Why the AVX-512 kernels cannot run here, or None when they can."""
    ops, why = _load()
    if ops is None:
        return why
    if not ops.has_vector_path():
        return "this CPU has no AVX-512F"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX512":  # ATEN_CPU_CAPABILITY may lower it: we follow torch
        return f"torch runs this CPU at {capability}, not AVX512"
    return None


if __name__ == "__main__":
    try:
        print(f"CPU kernels: {build()}")
    except Exception as error:  # a machine without a compiler still serves, on the sdpa backend
        why = f"warning: the CPU kernels did not build ({error}); sdpa and torch's own ops are used"
        print(why, file=sys.stderr)
        raise SystemExit(1) from error
