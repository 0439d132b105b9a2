"""`gemv`: a dense bf16 or fp32 weight on the CPU, multiplied at a few rows by our streaming kernel
(`csrc/cpu_gemv.cpp`), at more by the method that would hold it otherwise (oneDNN's packed GEMM).

A decode step at one or two streams is memory-bound: each weight is read once for a row or two.
oneDNN's blocked GEMM reads it at about 2/3 of the memory's speed there; the kernel streams each
weight row once for all rows, 1.5-1.8x faster (docs/benchmarks.md#decode-gemv). At more rows
(prefill, many streams) the GEMM's blocking wins, so the projection keeps both forms of the weight:
as loaded (which the LM head shares with tied input embeddings) and the other method's.
Sums are fp32 and rounded once, as oneDNN's are; only their order differs."""

from __future__ import annotations

import torch

from tritonlm.worker import cpu_kernels
from tritonlm.worker.linear.base import LinearMethod, Projection
from tritonlm.worker.linear.dense import DenseTorch
from tritonlm.worker.linear.onednn import OneDnnPacked

# Rows up to which the kernel beats oneDNN's packed GEMM on this project's CPUs (measured:
# docs/benchmarks.md#decode-gemv); past it the GEMM runs.
MAX_ROWS = 2
DTYPES = (torch.bfloat16, torch.float32)  # what the CPU platform fuses (the kernel takes fp16 too)
BEST = 2  # the kernel's level: the best loop this CPU has (AVX-512 BF16's dot products where it can)


class GemvProjection(Projection):
    method = "gemv"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, many_rows: Projection) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        self.weight, self.bias, self.many_rows = weight.contiguous(), bias, many_rows
        self.ops = cpu_kernels.kernels()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if rows.shape[0] > MAX_ROWS or rows.stride(-1) != 1:
            return self.many_rows(x)
        out = self.ops.gemv(rows, self.weight, self.bias, BEST)
        return out.view(*x.shape[:-1], self.out_features)


class GemvDense(LinearMethod):
    name = "gemv"

    @classmethod
    def supports(cls, weight: torch.Tensor) -> str | None:
        if weight.device.type != "cpu":
            return f"CPU only, not {weight.device.type}"
        if weight.dtype not in DTYPES:
            return f"bfloat16 or float32 weights only, not {weight.dtype}"
        return cpu_kernels.unavailable()  # built, and AVX-512 here

    @classmethod
    def prepare(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Projection:
        many = OneDnnPacked if OneDnnPacked.supports(weight) is None else DenseTorch
        return GemvProjection(weight, bias, many.prepare(weight, bias))
