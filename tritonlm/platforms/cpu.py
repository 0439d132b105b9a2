"""The CPU platform: torch's CPU kernels, oneDNN-packed projections, our C++ kernels (AVX-512)."""

from __future__ import annotations

import ctypes
import itertools
import types
from collections.abc import Callable

import torch

from tritonlm.platforms import KV_MEMORY_FRACTION
from tritonlm.platforms.base import Platform

# Inductor's options for `one_call` (docs/benchmarks.md: the C++ wrapper, measured).
ONE_CALL_OPTIONS: dict[str, object] = {"cpp_wrapper": True}
_one_calls = itertools.count()


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX-512 BF16 or AMX), as vLLM's CPU backend
    asks before it picks bfloat16: there a bf16 matmul runs 2-6x faster than fp32, elsewhere slower."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def available_memory(meminfo: str = "/proc/meminfo") -> int:
    """MemAvailable in bytes (4 GiB where the kernel does not say)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


class CpuPlatform(Platform):
    name = "cpu"
    attention_backends = ("cpu_paged", "sdpa")
    kv_memory_fraction = KV_MEMORY_FRACTION["cpu"]
    kv_capped_by_use = True

    @classmethod
    def unavailable(cls) -> str | None:
        return None

    def default_dtype(self, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        # Half-precision matmuls are slow or missing on CPUs without bf16 instructions.
        return torch.bfloat16 if cpu_has_native_bf16() else torch.float32

    def free_memory(self) -> int:
        return available_memory()

    def release_unused_memory(self) -> None:
        # glibc keeps what the load freed (checkpoint tensors cast, fused, packed: about 130 MB of a
        # SmolLM2 engine's RSS) for its next allocations; malloc_trim hands it back.
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: its allocator decides
            pass

    def configure_threads(self, threads: int) -> None:
        torch.set_num_threads(threads)

    def fuses_projections(self, dtype: torch.dtype) -> bool:
        return dtype in (torch.float32, torch.bfloat16)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def one_call(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """`step` compiled by Inductor (C++ kernels for what lies between our ops), whole
        (`fullgraph`: a graph break is an error, not a silent Python fallback), for its shapes."""
        # A code object of its own: dynamo keeps its compiled graphs per code object, and each
        # bucket's step would otherwise be one more recompile of the same code (and its guards
        # checked on every call).
        code = step.__code__.replace(co_name=f"{step.__code__.co_name}_{next(_one_calls)}")
        fresh = types.FunctionType(code, step.__globals__, code.co_name, step.__defaults__, step.__closure__)
        compiled = torch.compile(fresh, fullgraph=True, dynamic=False, options=ONE_CALL_OPTIONS)
        compiled()  # compiled now, not in the first step that needs it
        return compiled
