"""The paged KV pools: per layer one pool of keys and one of values.

Each pool is `[(num_blocks + 1) * block_size, kv_heads, head_dim]`, indexed by slot
(`attention.base.slot`); block `num_blocks` is a zero "null" block that pads gathers and stands
for blocks released behind a sliding window (`step.StepBatch`), never written. Which blocks a
sequence owns is decided by `tritonlm.engine.block_manager`; how attention reads the pools, by the
attention backend (`tritonlm.worker.attention.sdpa`).

With `kv_cache_dtype` int8 the pools hold int8 and each layer has two scale pools `[slots,
kv_heads]` (fp32) beside them: a token's key (or value) of one KV head is stored as round(x /
scale) with scale = absmax(x) / 127 over its head_dim numbers, computed when the token is written
(`quantize`). A scale per token and head needs no calibration and never rescales what is stored; it
costs 4 bytes per head_dim bytes (6% at head_dim 64). Only a backend that reads them
(`AttentionBackend.kv_cache_dtypes`) is given such a cache.
"""

from __future__ import annotations

import torch

from tritonlm.worker.attention.base import LayerShape
from tritonlm.worker.attention.registry import KV_CACHE_DTYPES

SCALE_DTYPE = torch.float32


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` [..., dim] as int8 [..., dim] and an fp32 scale per row [...]: symmetric, absmax / 127
    (a zero row gets a tiny scale, so it stays 0, never NaN)."""
    x = x.float()
    scale = x.abs().amax(-1).clamp_min(1e-30) / 127
    return torch.round(x / scale[..., None]).to(torch.int8), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What int8 rows `q` [..., dim] with `scale` [...] stand for."""
    return (q.float() * scale[..., None]).to(dtype)


class PagedKVCache:
    def __init__(
        self, block_size: int, dtype: torch.dtype, device: torch.device, kv_cache_dtype: str = "auto"
    ):
        assert kv_cache_dtype in KV_CACHE_DTYPES, kv_cache_dtype
        self.block_size = block_size
        self.dtype = dtype  # the model's: what is written and what attention returns
        self.quantized = kv_cache_dtype == "int8"
        self.storage = torch.int8 if self.quantized else dtype  # the pools' element type
        self.device = device
        self.num_blocks = 0
        self.keys: dict[
            int, torch.Tensor
        ] = {}  # layer -> [(num_blocks + 1) * block_size, kv_heads, head_dim]
        self.values: dict[int, torch.Tensor] = {}
        # int8 only: layer -> [(num_blocks + 1) * block_size, kv_heads], the scale of each stored row
        self.key_scales: dict[int, torch.Tensor] = {}
        self.value_scales: dict[int, torch.Tensor] = {}

    @property
    def null_slot(self) -> int:
        return self.num_blocks * self.block_size

    def bytes_per_block(self, shapes: dict[int, LayerShape]) -> int:
        """Bytes one block takes over all layers, for the key shapes a probe recorded."""
        size = self.storage.itemsize
        scale = SCALE_DTYPE.itemsize if self.quantized else 0  # per (token, head)
        return sum(2 * self.block_size * heads * (dim * size + scale) for heads, dim, _ in shapes.values())

    def allocate(self, num_blocks: int, shapes: dict[int, LayerShape]) -> None:
        """Allocates the pools, zeroed: writing every page makes the whole pool resident now, as
        vLLM does, so memory is flat after start-up (a lazily touched pool grows for minutes, which
        reads as a leak) and a machine short of memory fails at start, not under load. The null
        block must be zero anyway."""
        self.num_blocks = num_blocks
        rows = (num_blocks + 1) * self.block_size
        for layer, (heads, dim, _) in shapes.items():
            for pool in (self.keys, self.values):
                pool[layer] = torch.zeros((rows, heads, dim), dtype=self.storage, device=self.device)
            if self.quantized:
                for pool in (self.key_scales, self.value_scales):
                    pool[layer] = torch.zeros((rows, heads), dtype=SCALE_DTYPE, device=self.device)

    def _pools(self) -> list[torch.Tensor]:
        return [
            *self.keys.values(),
            *self.values.values(),
            *self.key_scales.values(),
            *self.value_scales.values(),
        ]

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._pools())

    def write(self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Stores the step's new keys/values [tokens, kv_heads, head_dim] of `layer` at `slots`,
        quantized when the pools are int8."""
        if not self.quantized:
            self.keys[layer].index_copy_(0, slots, key)
            self.values[layer].index_copy_(0, slots, value)
            return
        q, scale = quantize(torch.stack((key, value)))  # one pass for both
        self.keys[layer].index_copy_(0, slots, q[0])
        self.values[layer].index_copy_(0, slots, q[1])
        self.key_scales[layer].index_copy_(0, slots, scale[0])
        self.value_scales[layer].index_copy_(0, slots, scale[1])

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copies whole blocks (copy-on-write): (source, destination) block ids."""
        if not pairs:
            return
        offsets = torch.arange(self.block_size)
        src = (torch.tensor([s for s, _ in pairs])[:, None] * self.block_size + offsets).reshape(-1)
        dst = (torch.tensor([d for _, d in pairs])[:, None] * self.block_size + offsets).reshape(-1)
        src, dst = src.to(self.device), dst.to(self.device)
        for pool in self._pools():
            pool.index_copy_(0, dst, pool.index_select(0, src))
