"""`gguf`: a GGUF file's Q8_0 or Q6_K weight held as the file's own blocks (`Q8_0Weight`,
`Q6_KWeight`: the same bytes, 8.5 and 6.56 bits per value) and multiplied by our kernels
(`csrc/cpu_gguf.cpp`) without ever keeping the dense weight.

At a few rows (decode) `gguf_gemv` streams each weight row's blocks once for all rows, decoding
them in registers; past `MAX_ROWS` (prefill, many streams) a tile of output channels at a time is
decoded to the activations' dtype (at most `TILE_BYTES`, made per call) and multiplied by torch's
GEMM. The decoded values equal `gguf.quants.dequantize`'s exactly; sums are fp32 and rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from gguf import GGMLQuantizationType, dequantize

from tritonlm.worker import cpu_kernels
from tritonlm.worker.linear.base import LinearMethod, Projection, QuantizedWeight

DTYPES = (torch.float32, torch.bfloat16)  # the activations the kernels take
LEVEL = 2  # the best loops this CPU has (1: AVX-512F only; 0: the plain C++ ones, which the tests force)
# Rows up to which gguf_gemv beats decoding a tile and torch's GEMM (measured on this project's
# CPUs, SmolLM2-135M's projections: docs/features.md "GGUF files").
MAX_ROWS = 4
TILE_BYTES = 8 << 20  # decoded weight per GEMM at most: bounded memory for a large LM head


@dataclass
class GgufBlocksWeight(QuantizedWeight):
    """A weight `[out, in]` as GGUF blocks: `blocks` uint8 `[out, bytes per row]`, each row its
    inputs' blocks in order. `dtype`: the activations' dtype it multiplies (the model's)."""

    blocks: torch.Tensor
    in_features: int
    dtype: torch.dtype = torch.float32
    kind: ClassVar[GGMLQuantizationType]
    values: ClassVar[int]  # per block
    bytes: ClassVar[int]  # per block

    def __post_init__(self) -> None:
        if (
            self.in_features % self.values
            or self.blocks.shape[1] * self.values != self.in_features * self.bytes
        ):
            raise ValueError(
                f"{self.kind.name}: {self.blocks.shape[1]} bytes per row are not {self.in_features} inputs"
            )

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.blocks.shape[0], self.in_features))

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    @classmethod
    def cat(cls, weights: list[GgufBlocksWeight]) -> GgufBlocksWeight:
        """The weights stacked along their outputs (a fused q/k/v or gate/up)."""
        return cls(torch.cat([w.blocks for w in weights]), weights[0].in_features, weights[0].dtype)

    def rows(self, index: torch.Tensor) -> GgufBlocksWeight:
        """These output rows, in this order (GGUF's permuted q/k rows put back)."""
        return type(self)(self.blocks[index].contiguous(), self.in_features, self.dtype)

    def dequantize(self) -> torch.Tensor:
        """The dense weight, in `dtype`, by the gguf package (tests, and where no kernel runs)."""
        values = dequantize(self.blocks.numpy(), self.kind).astype(np.float32)
        return torch.from_numpy(values).reshape(self.shape).to(self.dtype)


class Q8_0Weight(GgufBlocksWeight):
    kind = GGMLQuantizationType.Q8_0
    values, bytes = 32, 34


class Q6_KWeight(GgufBlocksWeight):
    kind = GGMLQuantizationType.Q6_K
    values, bytes = 256, 210


WEIGHTS = {w.kind: w for w in (Q8_0Weight, Q6_KWeight)}


class GgufProjection(Projection):
    method = "gguf"

    def __init__(self, weight: GgufBlocksWeight, bias: torch.Tensor | None) -> None:
        super().__init__(weight.in_features, weight.shape[0])
        self.blocks, self.kind, self.bias = weight.blocks.contiguous(), int(weight.kind), bias
        self.tile = max(1, TILE_BYTES // (weight.in_features * weight.dtype.itemsize))
        self.ops, self.level = cpu_kernels.kernels(), LEVEL

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        # The bias is added before the one rounding (after it, a large sum and a bias that nearly
        # cancel it would keep the sum's rounding error).
        if rows.shape[0] <= MAX_ROWS:
            out = self.ops.gguf_gemv(rows, self.blocks, self.kind, self.bias, self.level)
        else:
            out = self._tiles(rows)
        return out.view(*x.shape[:-1], self.out_features)

    def _tiles(self, rows: torch.Tensor) -> torch.Tensor:
        """Many rows: a tile of output channels at a time decoded to `rows`' dtype, then torch's GEMM."""
        tiles = []
        for start in range(0, self.out_features, self.tile):
            blocks = self.blocks[start : start + self.tile]
            dense = torch.empty(blocks.shape[0], self.in_features, dtype=rows.dtype)
            self.ops.gguf_dequantize(dense, blocks, self.kind, self.level)
            if self.bias is None:
                tiles.append(torch.mm(rows, dense.t()))
            else:
                tiles.append(torch.addmm(self.bias[start : start + self.tile], rows, dense.t()))
        return tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=1)


def unavailable(dtype: torch.dtype) -> str | None:
    """Why the kernels cannot multiply activations of `dtype` here (on the CPU), or None."""
    if dtype not in DTYPES:
        return f"activations in {dtype} (the kernels take float32 and bfloat16)"
    return cpu_kernels.unavailable()  # built, and AVX-512 here


class GgufBlocks(LinearMethod):
    name = "gguf"
    holds = GgufBlocksWeight

    @classmethod
    def supports(cls, weight: GgufBlocksWeight) -> str | None:
        if weight.device.type != "cpu":
            return f"CPU only, not {weight.device.type}"
        return unavailable(weight.dtype)

    @classmethod
    def prepare(cls, weight: GgufBlocksWeight, bias: torch.Tensor | None) -> Projection:
        return GgufProjection(weight, bias)
