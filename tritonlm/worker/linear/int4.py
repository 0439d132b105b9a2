"""`int4`: a weight held as 4-bit integers in groups along its input features, each group with a
scale and a zero (`Int4Weight`), multiplied by torch's own CPU kernel (`_weight_int4pack_mm_for_cpu`,
the one torchao's CPU int4 layout uses) without ever making the dense weight.

The group rule is `value = (q - 8) * scale + zero` for `q` in 0..15, the kernel's own. GGUF's 4-bit
types map onto it exactly (`tritonlm/worker/gguf_blocks.py`): Q4_0 (`d·(q-8)`: zero 0), Q4_1 (`d·q + m`:
zero `m + 8d`) and Q4_K (`d·sc·q - dmin·m` per 32 values). Memory: half a byte per value plus two
numbers per group of 32 (in the activations' dtype), a quarter of bf16's.

Speed on this project's CPUs (AVX-512): in bf16 the kernel beats oneDNN's packed bf16 at one row
(30 µs against 38 for SmolLM2's 576→1536) and takes twice as long at 32 rows. In fp32 it runs a
reference loop, 25-80x slower: preparing an int4 projection for float32 activations warns (once).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from tritonlm.worker.linear.base import LinearMethod, Projection, QuantizedWeight, RowsProjection

log = logging.getLogger(__name__)

GROUP_SIZES = (32, 64, 128, 256)  # what the kernel takes


@dataclass
class Int4Weight(QuantizedWeight):
    """A weight `[out, in]` as `q` (uint8 holding 0..15) with per-group `scales` and `zeros`
    (`[out, in // group]`, float32): `value = (q - 8) * scale + zero`. `dtype`: the activations'
    dtype it multiplies (the model's), as a dense weight's own dtype is."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group: int
    dtype: torch.dtype = torch.float32

    @classmethod
    def quantize(cls, weight: torch.Tensor, group: int) -> Int4Weight:
        """`weight` `[out, in]` rounded to 16 levels per group of `group` inputs, spanning each
        group's minimum to its maximum (asymmetric: a group's values need not straddle zero), for
        `quantization: int4`. Each value is off by at most half a level (`scale / 2`)."""
        out_features, in_features = weight.shape
        if in_features % group:
            raise ValueError(f"{in_features} inputs are not a whole number of groups of {group}")
        groups = weight.detach().float().reshape(out_features, in_features // group, group)
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scales = (high - low) / 15
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # a constant group: any scale
        q = ((groups - low[..., None]) / scales[..., None]).round().clamp(0, 15)
        # q = 0 gives the minimum: (0 - 8) * scale + zero = low.
        zeros = low + 8 * scales
        return cls(q.to(torch.uint8).reshape(out_features, in_features), scales, zeros, group, weight.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes as the int4 method keeps it: half a byte per value (packed), a scale and a zero
        per group in the activations' dtype."""
        return self.q.numel() // 2 + 2 * self.scales.numel() * self.dtype.itemsize

    @classmethod
    def cat(cls, weights: list[Int4Weight]) -> Int4Weight:
        """The weights stacked along their outputs (a fused q/k/v or gate/up)."""
        groups = {w.group for w in weights}
        if len(groups) != 1:
            raise ValueError(f"cannot stack int4 weights of group sizes {sorted(groups)}")
        return cls(
            torch.cat([w.q for w in weights]),
            torch.cat([w.scales for w in weights]),
            torch.cat([w.zeros for w in weights]),
            groups.pop(),
            weights[0].dtype,
        )

    def rows(self, index: torch.Tensor) -> Int4Weight:
        """These output rows, in this order (GGUF's permuted q/k rows put back)."""
        return Int4Weight(self.q[index], self.scales[index], self.zeros[index], self.group, self.dtype)

    def dequantize(self) -> torch.Tensor:
        """The dense weight, in `dtype` (tests, and projections the kernel cannot take)."""
        scales = self.scales.repeat_interleave(self.group, dim=1)
        zeros = self.zeros.repeat_interleave(self.group, dim=1)
        return ((self.q.float() - 8) * scales + zeros).to(self.dtype)


class Int4Projection(RowsProjection):
    method = "int4"

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 1)
        # The kernel's layout: [in // group, out, (scale, zero)], in the activations' dtype.
        self.scales_and_zeros = torch.stack([weight.scales, weight.zeros], dim=-1).transpose(0, 1)
        self.scales_and_zeros = self.scales_and_zeros.contiguous().to(weight.dtype)
        self.group, self.bias = weight.group, bias

    def multiply(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows, self.packed, self.group, self.scales_and_zeros
        )


class Int4Packed(LinearMethod):
    name = "int4"
    holds = Int4Weight

    @classmethod
    def supports(cls, weight: Int4Weight) -> str | None:
        if weight.device.type != "cpu":
            return f"CPU only, not {weight.device.type}"
        out_features, in_features = weight.shape
        if weight.group not in GROUP_SIZES or in_features % weight.group:
            return f"groups of {weight.group} over {in_features} inputs (the kernel takes {GROUP_SIZES})"
        if out_features % 16:
            return f"{out_features} outputs (the kernel takes multiples of 16)"
        return None

    @classmethod
    def prepare(cls, weight: Int4Weight, bias: torch.Tensor | None) -> Projection:
        if weight.dtype == torch.float32:
            _warn_float32()
        return Int4Projection(weight, bias)


@functools.cache
def _warn_float32() -> None:
    """Once per process: whichever way the int4 weights came (a GGUF file, `quantization: int4`)."""
    log.warning(
        "int4 weights multiply 25-80x faster with dtype=bfloat16 (torch's kernel has no fast float32 loop)"
    )
