"""`int8`: a weight held as 8-bit integers with one scale per output channel (`Int8Weight`,
symmetric: `value = q * scale`, `q` in -127..127), multiplied by torch's own CPU kernel
(`_weight_int8pack_mm`: the activations stay in the model's dtype, W8A16) without making the dense
weight. Memory: a byte per value plus a scale per output row, half of bf16's.

Speed on this project's CPUs (AVX-512, 2 threads, SmolLM2's 576→1536 in bf16): 29 µs at one row
(oneDNN's packed bf16: 38), 430 µs at 32 rows (oneDNN: 160). W8A8 (each row's activations quantized
to int8 too, then `torch._int_mm`) took 170 µs at 32 rows but 95 µs at one row, and adds the
activations' rounding to the error: not taken (a decode step of a few sequences is the common case,
and results would depend on which kernel a batch size picked).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonlm.worker.linear.base import LinearMethod, Projection, QuantizedWeight, RowsProjection

DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the kernel multiplies


@dataclass
class Int8Weight(QuantizedWeight):
    """A weight `[out, in]` as `q` (int8, -127..127) and per-output-row `scales` (`[out]`, float32):
    `value = q * scale`. `dtype`: the activations' dtype it multiplies (the model's)."""

    q: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype = torch.float32

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * self.dtype.itemsize

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Int8Weight:
        """`weight` `[out, in]` rounded per output row to 255 levels symmetric about zero (the row's
        largest magnitude is 127): each value off by at most half a level (`scale / 2`)."""
        rows = weight.detach().float()
        scales = rows.abs().amax(dim=1) / 127
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero row
        q = (rows / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        return cls(q, scales, weight.dtype)

    @classmethod
    def cat(cls, weights: list[Int8Weight]) -> Int8Weight:
        """The weights stacked along their outputs (a fused q/k/v or gate/up)."""
        return cls(
            torch.cat([w.q for w in weights]), torch.cat([w.scales for w in weights]), weights[0].dtype
        )

    def dequantize(self) -> torch.Tensor:
        """The dense weight, in `dtype` (tests, and projections the kernel cannot take)."""
        return (self.q.float() * self.scales[:, None]).to(self.dtype)


class Int8Projection(RowsProjection):
    method = "int8"

    def __init__(self, weight: Int8Weight, bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        self.q = weight.q.contiguous()
        self.scales = weight.scales.to(weight.dtype)  # the kernel's: in the activations' dtype
        self.bias = bias

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, self.q, self.scales)


class Int8Packed(LinearMethod):
    name = "int8"
    holds = Int8Weight

    @classmethod
    def supports(cls, weight: Int8Weight) -> str | None:
        if weight.device.type != "cpu":
            return f"CPU only, not {weight.device.type}"
        if weight.dtype not in DTYPES:
            return f"activations in {weight.dtype} (the kernel takes {', '.join(map(str, DTYPES))})"
        return None

    @classmethod
    def prepare(cls, weight: Int8Weight, bias: torch.Tensor | None) -> Projection:
        return Int8Projection(weight, bias)
