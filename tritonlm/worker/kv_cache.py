"""The paged KV cache and the attention function that reads and writes it.

Every layer has one pool of keys and one of values, `[num_blocks + 1, block_size, kv_heads,
head_dim]`; block `num_blocks` is a zero "null" block that pads gathers. Which blocks a sequence
owns is decided by `tritonlm.engine.block_manager`; the runner turns that into a `StepLayout` once per
forward step (index tensors only), and this module's attention function, registered with
transformers' AttentionInterface, uses it in every layer:

1. write the step's new keys/values into their slots (one `index_copy_` for the whole step);
2. decode tokens (one new token per sequence, placed first in the packed batch): gather each
   sequence's cached keys/values into a padded `[batch, kv_heads, length, head_dim]` view and run
   one batched `scaled_dot_product_attention` with a length mask;
3. prefill chunks: per sequence, causal attention over its own new tokens, or over its cached prefix
   plus the new tokens (a later chunk, or a prompt whose prefix came from the prefix cache).

Any transformers decoder whose attention goes through the interface (Llama, Qwen2, Mistral, GPT-2 …)
works unchanged; grouped-query attention goes through SDPA's `enable_gqa`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

ATTENTION_NAME = "tritonlm_paged"
_instances = itertools.count()


@dataclass
class PrefillPart:
    """One sequence's chunk of several new tokens in the packed batch."""

    offset: int  # first token of the chunk in the packed batch
    length: int  # new tokens
    start: int  # tokens of the sequence already cached before the chunk
    slots: torch.Tensor | None  # [start + length] cache slots of all its tokens (None: start == 0)
    mask: torch.Tensor | None  # [length, start + length] causal mask shifted by start


@dataclass
class StepLayout:
    """Where every token of one packed forward step goes, built once per step by the runner."""

    slot_mapping: torch.Tensor  # [tokens]: cache slot of each new token
    num_decodes: int  # the first tokens of the batch are single new tokens of decoding sequences
    decode_slots: torch.Tensor | None  # [num_decodes, max_len]: slots to attend to (null-padded)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_len]: None when lengths are equal
    prefills: list[PrefillPart]
    # With the decode workspace instead of decode_slots: decode token i is row i, at this position.
    decode_positions: torch.Tensor | None = None  # [num_decodes]
    decode_length: int = 0  # longest decoding sequence, this step's token included
    # Workspace rows to fill from the pool in each layer, after the step's keys/values are written
    # (a prefix cached in this very step is computed by another sequence of the step): (row, slots).
    workspace_fills: list[tuple[int, torch.Tensor]] = field(default_factory=list)


class DecodeWorkspace:
    """Contiguous copies of the decoding sequences' keys/values, kept across steps (CPU only).

    Gathering every decoding sequence's blocks in every layer of every step copies the whole
    context, which on a CPU costs as much memory traffic as the attention itself. Here each decoding
    sequence owns a row of per-layer tensors `[rows, kv_heads, capacity, head_dim]`; a step appends
    its one new key/value to the row (besides the pool, which stays the reference), and the batched
    attention reads rows `[0, batch)` in place. A sequence gets a row, filled once from its blocks,
    when it starts decoding; rows of sequences no longer decoding are given up and the rest are kept
    dense, so the step's decoding sequences are exactly rows `[0, batch)`, in row order.
    """

    def __init__(self, cache: PagedKVCache, max_rows: int, max_len: int, max_bytes: int):
        self.cache = cache
        self.max_rows = max_rows
        self.max_len = max_len
        self.max_bytes = max_bytes
        self.rows: list[object | None] = [None] * max_rows  # the Sequence in each row
        self.lengths = [0] * max_rows  # positions held by each row
        self.capacity = 0
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}

    def reset(self) -> None:
        self.rows = [None] * self.max_rows
        self.lengths = [0] * self.max_rows

    def _bytes(self, capacity: int) -> int:
        return sum(
            2 * self.max_rows * capacity * t.shape[1] * t.shape[2] * t.element_size()
            for t in self.cache.keys.values()
        )

    def prepare(self, seqs: list, block_size: int) -> tuple[list[int], list[tuple[int, torch.Tensor]]] | None:
        """Makes `seqs` (each about to feed the token at position `num_computed`) rows `[0, len)`.
        Returns the order of `seqs` by row and the rows to fill from the pool during the forward
        (`StepLayout.workspace_fills`), or None to use the gather path (too much memory)."""
        wanted = {id(s): i for i, s in enumerate(seqs)}
        for r, s in enumerate(self.rows):  # rows of sequences not decoding now, or out of date
            if s is not None and (id(s) not in wanted or self.lengths[r] != s.num_computed):
                self.rows[r] = None
        need = max(s.num_computed + 1 for s in seqs)
        if need > self.capacity:
            capacity = min(-(-need // 256) * 256, max(self.max_len, need))
            if self._bytes(capacity) > self.max_bytes:
                self.reset()
                self.keys, self.values, self.capacity = {}, {}, 0
                return None
            self._grow(capacity)
        batch = len(seqs)
        # Keep the used rows dense: move rows from the end into the holes of [0, batch).
        holes = [r for r in range(batch) if self.rows[r] is None]
        movers = [r for r in range(batch, self.max_rows) if self.rows[r] is not None]
        for hole, mover in zip(holes, movers, strict=False):
            n = self.lengths[mover]
            for pool in (*self.keys.values(), *self.values.values()):
                pool[hole, :, :n] = pool[mover, :, :n]
            self.rows[hole], self.lengths[hole], self.rows[mover] = self.rows[mover], n, None
        # Sequences new to decoding: a free row, filled from their blocks during the forward.
        present = {id(s) for s in self.rows if s is not None}
        free = iter(r for r in range(batch) if self.rows[r] is None)
        fills = []
        for s in seqs:
            if id(s) in present:
                continue
            r = next(free)
            n = s.num_computed
            if n:
                table = torch.tensor(s.block_table, dtype=torch.long)
                pos = torch.arange(n)
                fills.append(
                    (r, (table[pos // block_size] * block_size + pos % block_size).to(self.cache.device))
                )
            self.rows[r] = s
        row_of = {id(s): r for r, s in enumerate(self.rows) if s is not None}
        order = sorted(range(batch), key=lambda i: row_of[id(seqs[i])])
        for r in range(batch):  # after this step's forward every row holds one more position
            self.lengths[r] = self.rows[r].num_computed + 1
        return order, fills

    def fill(self, layer: int, fills: list[tuple[int, torch.Tensor]]) -> None:
        k_pool, v_pool = self.cache.keys[layer], self.cache.values[layer]
        for row, slots in fills:
            n = slots.shape[0]
            self.keys[layer][row, :, :n] = k_pool[slots].transpose(0, 1)
            self.values[layer][row, :, :n] = v_pool[slots].transpose(0, 1)

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


class ShapeProbe:
    """Stands in for the cache during a probe forward: records each layer's key shape and dtype."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[int, int, torch.dtype]] = {}


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
        self.layout: StepLayout | None = None  # set by the runner around each forward
        self.probe: ShapeProbe | None = None
        self.workspace: DecodeWorkspace | None = None  # set by the runner on CPU

    @property
    def null_slot(self) -> int:
        return self.num_blocks * self.block_size

    def bytes_per_block(self, shapes: dict[int, tuple[int, int, torch.dtype]]) -> int:
        """Bytes one block takes over all layers, for the key shapes a probe recorded."""
        size = torch.tensor([], dtype=self.dtype).element_size()
        return sum(2 * self.block_size * heads * dim * size for heads, dim, _ in shapes.values())

    def allocate(self, num_blocks: int, shapes: dict[int, tuple[int, int, torch.dtype]]) -> None:
        """Allocates the pools. Left uninitialised (only slots written by a step are ever read, so
        CPU pages are touched as blocks come into use), except the zero null block."""
        self.num_blocks = num_blocks
        rows = (num_blocks + 1) * self.block_size
        for layer, (heads, dim, _) in shapes.items():
            for pool in (self.keys, self.values):
                pool[layer] = torch.empty((rows, heads, dim), dtype=self.dtype, device=self.device)
                pool[layer][self.null_slot :].zero_()

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

    def attention(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,  # [1, heads, tokens, head_dim]
        key: torch.Tensor,  # [1, kv_heads, tokens, head_dim]
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]:
        gqa = query.shape[1] != key.shape[1]
        if self.probe is not None:
            self.probe.layers[module.layer_idx] = (key.shape[1], key.shape[3], key.dtype)
            out = F.scaled_dot_product_attention(
                query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa
            )
            return out.transpose(1, 2), None
        layout = self.layout
        assert layout is not None, "attention called outside a runner step"
        k_pool, v_pool = self.keys[module.layer_idx], self.values[module.layer_idx]
        k_pool.index_copy_(0, layout.slot_mapping, key[0].transpose(0, 1))
        v_pool.index_copy_(0, layout.slot_mapping, value[0].transpose(0, 1))

        outputs = []
        n = layout.num_decodes
        if n:
            q = query[0, :, :n].transpose(0, 1).unsqueeze(2)  # [batch, heads, 1, head_dim]
            if layout.decode_positions is not None:  # rows [0, n) of the workspace, in place
                ws = self.workspace
                if layout.workspace_fills:
                    ws.fill(module.layer_idx, layout.workspace_fills)
                rows = torch.arange(n, device=query.device)
                k_rows, v_rows = ws.keys[module.layer_idx], ws.values[module.layer_idx]
                k_rows[rows, :, layout.decode_positions] = key[0, :, :n].transpose(0, 1)
                v_rows[rows, :, layout.decode_positions] = value[0, :, :n].transpose(0, 1)
                k = k_rows[:n, :, : layout.decode_length]
                v = v_rows[:n, :, : layout.decode_length]
            else:  # gather their blocks: [batch, kv_heads, length, head_dim]
                k = k_pool[layout.decode_slots].transpose(1, 2)
                v = v_pool[layout.decode_slots].transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=layout.decode_mask, scale=scaling, enable_gqa=gqa
            )
            outputs.append(out.squeeze(2))  # [batch, heads, head_dim]
        for part in layout.prefills:
            q = query[:, :, part.offset : part.offset + part.length]
            if part.slots is None:  # the whole sequence is in this chunk: its own keys, causal
                k = key[:, :, part.offset : part.offset + part.length]
                v = value[:, :, part.offset : part.offset + part.length]
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=gqa)
            else:  # after a cached prefix: its blocks, with the causal mask shifted by the prefix
                k = k_pool[part.slots].transpose(0, 1)[None]
                v = v_pool[part.slots].transpose(0, 1)[None]
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=part.mask, scale=scaling, enable_gqa=gqa
                )
            outputs.append(out[0].transpose(0, 1))  # [length, heads, head_dim]
        return torch.cat(outputs)[None] if len(outputs) > 1 else outputs[0][None], None


def _no_mask(*args: object, **kwargs: object) -> None:
    # The attention function builds its own per-sequence masks from the step layout.
    return None


def register(cache: PagedKVCache) -> str:
    """Registers `cache.attention` under a name of its own (so several runners can live in one
    process) and returns it, to pass as the model's attn_implementation."""
    name = f"{ATTENTION_NAME}_{next(_instances)}"
    AttentionInterface.register(name, cache.attention)
    AttentionMaskInterface.register(name, _no_mask)
    return name
