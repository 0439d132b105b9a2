"""GGUF's block types → what the worker holds: the 4-bit types as `Int4Weight` (exactly: each 32
values share one scale and zero), Q8_0 and Q6_K as their own blocks (`linear/gguf.py`'s
`Q8_0Weight`, `Q6_KWeight`, the bytes copied as they are), every other type dequantized by the
`gguf` package.

A quantized tensor's data, as `gguf.GGUFReader` maps it, is `uint8 [rows, bytes per row]`, each row
a run of blocks along the input features. Layouts (llama.cpp's `ggml-common.h`):

- Q4_0, 18 bytes per 32 values: `d` (fp16), 16 bytes of nibbles (value j in the low nibble of byte j,
  value j + 16 in its high nibble); `value = d·(q - 8)`.
- Q4_1, 20 bytes per 32: `d`, `m` (fp16), the same nibbles; `value = d·q + m`.
- Q4_K, 144 bytes per 256: `d`, `dmin` (fp16), twelve bytes packing eight 6-bit scales and mins,
  128 bytes of nibbles (each 64 values: 32 low nibbles, then the same bytes' 32 high nibbles);
  `value = d·scale_j·q - dmin·min_j` for the 32 values of sub-block j.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Type
from gguf import dequantize
from gguf.quants import Q4_K

from tritonlm.worker.linear import Int4Weight
from tritonlm.worker.linear.gguf import WEIGHTS, GgufBlocksWeight

INT4_TYPES = (Type.Q4_0, Type.Q4_1, Type.Q4_K)
BLOCK_TYPES = tuple(WEIGHTS)  # kept as the file's blocks: Q8_0, Q6_K
DENSE_TYPES = (Type.F32, Type.F16, Type.BF16)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """Two bytes per entry (the last axis) read as float16, as float32."""
    return raw.copy().view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """`[..., n]` bytes → `[..., 2n]` values: the low nibbles, then the high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _int4(data: np.ndarray, kind: Type) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`q [rows, in]`, `scale` and `zero [rows, in // 32]` such that `value = (q - 8)·scale + zero`."""
    rows = data.shape[0]
    if kind == Type.Q4_0:
        blocks = data.reshape(rows, -1, 18)
        scale = _fp16(blocks[..., 0:2])
        return _nibbles(blocks[..., 2:]).reshape(rows, -1), scale, np.zeros_like(scale)
    if kind == Type.Q4_1:
        blocks = data.reshape(rows, -1, 20)
        scale, low = _fp16(blocks[..., 0:2]), _fp16(blocks[..., 2:4])
        return _nibbles(blocks[..., 4:]).reshape(rows, -1), scale, low + 8 * scale
    blocks = data.reshape(-1, 144)  # Q4_K
    d, dmin = _fp16(blocks[:, 0:2])[:, None], _fp16(blocks[:, 2:4])[:, None]
    sub_scales, sub_mins = Q4_K.get_scale_min(blocks[:, 4:16])
    scale = d * sub_scales.astype(np.float32)
    low = -(dmin * sub_mins.astype(np.float32))
    q = _nibbles(blocks[:, 16:].reshape(-1, 4, 32))  # [blocks, 4 chunks, 64]
    return q.reshape(rows, -1), scale.reshape(rows, -1), (low + 8 * scale).reshape(rows, -1)


def int4_weight(data: np.ndarray, kind: Type, dtype: torch.dtype) -> Int4Weight:
    """A 4-bit tensor's blocks as the `int4` linear method's weight (`dtype`: the activations')."""
    q, scale, zero = _int4(np.asarray(data), kind)
    return Int4Weight(torch.from_numpy(q), torch.from_numpy(scale), torch.from_numpy(zero), 32, dtype)


def blocks_weight(data: np.ndarray, kind: Type, in_features: int, dtype: torch.dtype) -> GgufBlocksWeight:
    """A Q8_0 or Q6_K tensor's blocks (`uint8 [rows, bytes per row]`, copied out of the file's
    mapping) as the `gguf` linear method's weight (`dtype`: the activations')."""
    return WEIGHTS[kind](torch.from_numpy(np.array(data, dtype=np.uint8)), in_features, dtype)


def dense(data: np.ndarray, kind: Type, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Any tensor, dequantized where it is quantized, as a `shape` tensor of `dtype`."""
    values = np.asarray(data) if kind in (Type.F32, Type.F16) else dequantize(data, kind)
    return torch.from_numpy(np.ascontiguousarray(values).astype(np.float32)).reshape(shape).to(dtype)
