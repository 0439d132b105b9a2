"""The CUDA platform: torch's CUDA kernels; a step's host tensors go up from pinned memory without
blocking the host."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tritonlm.platforms import KV_MEMORY_FRACTION
from tritonlm.platforms.base import Platform

CAPTURE_WARMUPS = 2  # runs before a capture (allocator, cuBLAS handles, lazy modules)


class CudaPlatform(Platform):
    name = "cuda"
    attention_backends = ("sdpa",)
    kv_memory_fraction = KV_MEMORY_FRACTION["cuda"]
    captures_graphs = True  # a bucket's capture takes well under a second (docs/benchmarks.md)

    @classmethod
    def unavailable(cls) -> str | None:
        if not torch.cuda.is_available():
            return "torch sees no CUDA device (a CPU build, or no GPU visible)"
        return None

    def default_dtype(self, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        # The checkpoint's half precision when it has one; bf16 rather than fp32 otherwise.
        return checkpoint_dtype if checkpoint_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16

    def free_memory(self) -> int:
        free, _ = torch.cuda.mem_get_info(self.device)
        return free

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        # Pinned, the copy is asynchronous: the host goes on packing while it runs.
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def one_call(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """`step` captured as a CUDA graph (run first on a side stream, as capture requires: its
        lazy initialisations done); the call replays it and returns the graph's output buffer,
        rewritten by the next replay."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(CAPTURE_WARMUPS):
                step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay

    def describe(self) -> str:
        return f"{self.device} ({torch.cuda.get_device_name(self.device)})"
