"""`onednn`: the weight pre-packed once into oneDNN's blocked layout, multiplied by
`mkldnn._linear_pointwise` (what inductor's freezing uses). On the CPU at serving batch sizes (tens
of rows) each small matrix multiply costs as much in fixed overhead as in arithmetic; the packed
weight makes it 1.2x (bf16) to 1.5x (fp32) faster than `F.linear` at 32 rows on this project's CPUs.
Bitwise `F.linear` in bf16 (both oneDNN); in fp32 it differs from MKL's sgemm by summation order."""

from __future__ import annotations

import torch

from tritonlm.worker.linear.base import LinearMethod, Projection

# The row count oneDNN packs for (a hint: any count works): a decode step's batch.
PACK_ROWS = 32


class PackedProjection(Projection):
    method = "onednn"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


class OneDnnPacked(LinearMethod):
    name = "onednn"

    @classmethod
    def supports(cls, weight: torch.Tensor) -> str | None:
        if weight.device.type != "cpu":
            return f"CPU only, not {weight.device.type}"
        if not torch.backends.mkldnn.is_available():
            return "this torch is built without oneDNN"
        if weight.dtype == torch.float32:
            return None
        if weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return None
        return f"oneDNN does not pack {weight.dtype} on this CPU"

    @classmethod
    def prepare(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Projection:
        return PackedProjection(weight, bias)
