"""Contiguous per-sequence copies of the decoding sequences' keys/values, kept across steps (CPU).

Gathering every decoding sequence's blocks in every layer of every step copies the whole context,
which on a CPU costs as much memory traffic as the attention itself. Here each decoding sequence
owns a row of per-layer tensors `[rows, kv_heads, capacity, head_dim]`; a step appends its new
keys/values to the row (one position, or k with proposals; besides the pool, which stays the
reference), and the batched decode attention reads rows `[0, batch)` in place. A sequence gets a
row, filled once from its blocks, when it starts decoding; rows of sequences no longer decoding are
given up and the rest are kept dense, so the step's decoding sequences are exactly rows
`[0, batch)`, in row order.

A row is trusted only up to its sequence's `num_computed`: after rejected proposals were rolled
back (`BlockManager.rollback`), the positions past it are stale and are written again; a row that
fell behind its sequence (which went on without it) is dropped and filled again. A fill reads zeros
for blocks released behind a sliding window (their entries name the pool's null block): positions
the window masks hide.
"""

from __future__ import annotations

import torch

from tritonlm.worker.attention.base import slots
from tritonlm.worker.kv_cache import PagedKVCache


class DecodeWorkspace:
    def __init__(self, cache: PagedKVCache, max_rows: int, max_len: int, max_bytes: int):
        self.cache = cache
        self.max_rows = max_rows
        self.max_len = max_len
        self.max_bytes = max_bytes
        self.rows: list[int | None] = [None] * max_rows  # the sequence (its step id) in each row
        self.lengths = [0] * max_rows  # positions held by each row
        self.capacity = 0
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        full = -(-max_len // 256) * 256
        if cache.keys and self._bytes(full) <= max_bytes:  # resident from the start, like the pool
            self._grow(full)

    def reset(self) -> None:
        self.rows = [None] * self.max_rows
        self.lengths = [0] * self.max_rows

    def _bytes(self, capacity: int) -> int:
        return sum(
            2 * self.max_rows * capacity * t.shape[1] * t.shape[2] * t.element_size()
            for t in self.cache.keys.values()
        )

    def prepare(
        self,
        seq_ids: list[int],
        num_computed: list[int],
        block_tables: list[list[int]],
        num_new: list[int],
        block_size: int,
    ) -> tuple[list[int], list[tuple[int, torch.Tensor]]] | None:
        """Makes the sequences `seq_ids` (each about to feed `num_new[i]` tokens from position
        `num_computed[i]`) rows `[0, len)`. Returns their order by row and the rows to fill from the
        pool during the forward (`SdpaMetadata.workspace_fills`), or None to use the gather path
        (too much memory)."""
        computed = dict(zip(seq_ids, num_computed, strict=True))
        for r, s in enumerate(self.rows):
            if s is None:
                continue
            p = computed.get(s)
            if p is None or self.lengths[r] < p:  # not decoding, or behind
                self.rows[r] = None
            elif self.lengths[r] > p:  # rolled back: the positions past it are stale
                self.lengths[r] = p
        need = max(p + n for p, n in zip(num_computed, num_new, strict=True))
        if need > self.capacity:
            capacity = min(-(-need // 256) * 256, max(self.max_len, need))
            if self._bytes(capacity) > self.max_bytes:
                self.reset()
                self.keys, self.values, self.capacity = {}, {}, 0
                return None
            self._grow(capacity)
        batch = len(seq_ids)
        # Keep the used rows dense: move rows from the end into the holes of [0, batch).
        holes = [r for r in range(batch) if self.rows[r] is None]
        movers = [r for r in range(batch, self.max_rows) if self.rows[r] is not None]
        for hole, mover in zip(holes, movers, strict=False):
            n = self.lengths[mover]
            for pool in (*self.keys.values(), *self.values.values()):
                pool[hole, :, :n] = pool[mover, :, :n]
            self.rows[hole], self.lengths[hole], self.rows[mover] = self.rows[mover], n, None
        # Sequences new to decoding: a free row, filled from their blocks during the forward.
        present = {s for s in self.rows if s is not None}
        free = iter(r for r in range(batch) if self.rows[r] is None)
        fills = []
        for s, n, table in zip(seq_ids, num_computed, block_tables, strict=True):
            if s in present:
                continue
            r = next(free)
            if n:
                fills.append((r, slots(table, 0, n, block_size).to(self.cache.device)))
            self.rows[r] = s
        row_of = {s: r for r, s in enumerate(self.rows) if s is not None}
        order = sorted(range(batch), key=lambda i: row_of[seq_ids[i]])
        for r, i in enumerate(order):  # after this step's forward every row holds its new positions
            self.lengths[r] = num_computed[i] + num_new[i]
        return order, fills

    def fill(self, layer: int, fills: list[tuple[int, torch.Tensor]]) -> None:
        k_pool, v_pool = self.cache.keys[layer], self.cache.values[layer]
        for row, row_slots in fills:
            n = row_slots.shape[0]
            self.keys[layer][row, :, :n] = k_pool[row_slots].transpose(0, 1)
            self.values[layer][row, :, :n] = v_pool[row_slots].transpose(0, 1)

    def _grow(self, capacity: int) -> None:
        for layer, pool in self.cache.keys.items():
            heads, dim = pool.shape[1], pool.shape[2]
            for store in (self.keys, self.values):
                new = torch.zeros(
                    (self.max_rows, heads, capacity, dim), dtype=pool.dtype, device=self.cache.device
                )
                if layer in store:
                    new[:, :, : self.capacity] = store[layer]
                store[layer] = new
        self.capacity = capacity
