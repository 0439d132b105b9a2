"""The paged KV pools: per layer one pool of keys and one of values.

Each pool is `[(num_blocks + 1) * block_size, kv_heads, head_dim]`, indexed by slot
(`attention.base.slot`); block `num_blocks` is a zero "null" block that pads gathers and stands
for blocks released behind a sliding window (`step.StepBatch`), never written. Which blocks a
sequence owns is decided by `tritonlm.engine.block_manager`; how attention reads the pools, by the
attention backend (`tritonlm.worker.attention.sdpa`).
"""

from __future__ import annotations

import torch

from tritonlm.worker.attention.base import LayerShape


class PagedKVCache:
    def __init__(self, block_size: int, dtype: torch.dtype, device: torch.device):
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        self.num_blocks = 0
        self.keys: dict[
            int, torch.Tensor
        ] = {}  # layer -> [(num_blocks + 1) * block_size, kv_heads, head_dim]
        self.values: dict[int, torch.Tensor] = {}

    @property
    def null_slot(self) -> int:
        return self.num_blocks * self.block_size

    def bytes_per_block(self, shapes: dict[int, LayerShape]) -> int:
        """Bytes one block takes over all layers, for the key shapes a probe recorded."""
        size = torch.tensor([], dtype=self.dtype).element_size()
        return sum(2 * self.block_size * heads * dim * size for heads, dim, _ in shapes.values())

    def allocate(self, num_blocks: int, shapes: dict[int, LayerShape]) -> None:
        """Allocates the pools, zeroed: writing every page makes the whole pool resident now, as
        vLLM does, so memory is flat after start-up (a lazily touched pool grows for minutes, which
        reads as a leak) and a machine short of memory fails at start, not under load. The null
        block must be zero anyway."""
        self.num_blocks = num_blocks
        rows = (num_blocks + 1) * self.block_size
        for layer, (heads, dim, _) in shapes.items():
            for pool in (self.keys, self.values):
                pool[layer] = torch.zeros((rows, heads, dim), dtype=self.dtype, device=self.device)

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values()))

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copies whole blocks (copy-on-write): (source, destination) block ids."""
        if not pairs:
            return
        offsets = torch.arange(self.block_size)
        src = (torch.tensor([s for s, _ in pairs])[:, None] * self.block_size + offsets).reshape(-1)
        dst = (torch.tensor([d for _, d in pairs])[:, None] * self.block_size + offsets).reshape(-1)
        src, dst = src.to(self.device), dst.to(self.device)
        for pool in (*self.keys.values(), *self.values.values()):
            pool.index_copy_(0, dst, pool.index_select(0, src))
