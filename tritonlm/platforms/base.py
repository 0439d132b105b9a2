"""`Platform`: what the engine needs to know about the device it runs on, in one interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch


class Platform(ABC):
    """One device's answers. Subclasses: `cpu.CpuPlatform`, `cuda.CudaPlatform`."""

    name: str = ""
    # Attention backends (`worker/attention/registry.py` names) that may run here, best first; each
    # backend still says whether it runs in this build (`AttentionBackend.available`).
    attention_backends: tuple[str, ...] = ()
    # The KV cache's share of free memory when `kv_cache_memory_fraction` is 0 (unset).
    kv_memory_fraction: float = 0.0
    # Whether the KV cache is capped at what max_num_seqs sequences of max_seq_len can use (CPU pages
    # are touched only as blocks come into use; a GPU's memory is the engine's to take).
    kv_capped_by_use: bool = False
    # Whether `one_call` is cheap enough at start-up to be on by default (`decode_graphs` unset).
    captures_graphs: bool = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @classmethod
    @abstractmethod
    def unavailable(cls) -> str | None:
        """Why this platform cannot run in this process (None: it can)."""

    @abstractmethod
    def default_dtype(self, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        """What `dtype: auto` means here, for a checkpoint saved in `checkpoint_dtype`."""

    @abstractmethod
    def free_memory(self) -> int:
        """Bytes the KV cache may size itself from, after the weights are loaded."""

    def release_unused_memory(self) -> None:
        """Gives the host memory the model's load freed back to the system (its temporary copies),
        before the KV cache is sized from what is free; nothing to do by default."""
        return None

    def configure_threads(self, threads: int) -> None:
        """Sets the engine process's compute threads (`EngineConfig.engine_threads`); by default the
        platform's own scheduling decides."""
        return None

    def fuses_projections(self, dtype: torch.dtype) -> bool:
        """Whether `fuse_projections` applies here (one matrix multiply per group of projections)."""
        return False

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A step's host tensor on this device (a no-op where host and device are one)."""
        return tensor.to(self.device)

    def synchronize(self) -> None:
        """Waits for the device's queued work (timings, tests); nothing is queued by default."""
        return None

    def one_call(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """`step` (a decode step over static inputs, `worker/decode_graph.py`) made one call now,
        at start-up: the call runs what `step` runs on whatever its inputs then hold. By default it
        is `step` itself."""
        return step

    def describe(self) -> str:
        return str(self.device)
