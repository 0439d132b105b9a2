"""The SDPA backend: the paged pools of `kv_cache`, read with torch's scaled_dot_product_attention.

In every layer (`forward`), over the step's `SdpaMetadata`:

1. write the step's new keys/values into their slots (one `index_copy_` for the whole step);
2. decode tokens: one batched SDPA call over each decoding sequence's cached keys/values, gathered
   from its blocks or, on CPU, read in place from its `DecodeWorkspace` row, with a length mask;
3. prefill chunks: per sequence, causal attention over its own new tokens, or over its cached prefix
   plus the new tokens (a later chunk, or a prompt whose prefix came from the prefix cache).

Rejected proposals leave stale keys/values in their slots, which are given back
(`BlockManager.rollback`) and overwritten before anyone reads them. Any transformers decoder whose
attention goes through the interface (Llama, Qwen2, Mistral, GPT-2 …) works unchanged; grouped-query
attention goes through SDPA's `enable_gqa`, or, with `fuse_projections` on CPU, is folded into the
query length (`fold_gqa`).

A layer that needs more than causal softmax attention (its `LayerRule`, decided once per layer from
what the probe saw) reads the same keys/values: a sliding window as masks of its own (still SDPA),
soft-capping or sinks through `explicit.attention` instead of SDPA. Plain layers take neither.
When every layer has a window, the engine releases the blocks behind it (`step.Worker.kv_window`):
their table entries name the pool's zero null block, so the gathers, the prefixes and the decode
workspace's fills read zeros there, at positions every layer's window mask hides.

A decode graph's step (`worker/decode_graph.py`, plain layers only) hands it `PagedMetadata`
instead: the same writes, then `paged.attend` over fixed-width block tables, static shapes for a
CUDA graph. Its padded rows write finite keys and values into the null block, which every reader
masks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from tritonlm.worker.attention import explicit, paged, sdpa_metadata
from tritonlm.worker.attention.base import (
    FEATURES,
    NOTHING,
    AttentionBackend,
    DecodePlan,
    LayerRule,
    LayerShape,
    PackedStep,
)
from tritonlm.worker.attention.sdpa_metadata import Masks, SdpaMetadata
from tritonlm.worker.decode_workspace import DecodeWorkspace
from tritonlm.worker.kv_cache import PagedKVCache


class SdpaBackend(AttentionBackend):
    name = "sdpa"
    computes = frozenset(FEATURES)

    def __init__(
        self, block_size: int, dtype: torch.dtype, device: torch.device, kv_cache_dtype: str = "auto"
    ) -> None:
        super().__init__(block_size, dtype, device, kv_cache_dtype)
        self.cache = PagedKVCache(block_size, dtype, device, kv_cache_dtype)
        self.rules: dict[int, LayerRule] = {}  # the layers that are not plain, set by `allocate`
        self.workspace: DecodeWorkspace | None = None  # on CPU, set by `allocate`
        # Decode attention with one query per sequence folds GQA groups into the query length.
        self.fold_gqa = False

    # -- the KV layout ---------------------------------------------------------------------------
    def bytes_per_block(self, shapes: dict[int, LayerShape]) -> int:
        return self.cache.bytes_per_block(shapes)

    def allocate(
        self, num_blocks: int, shapes: dict[int, LayerShape], max_num_seqs: int, max_seq_len: int
    ) -> None:
        self.cache.allocate(num_blocks, shapes)
        rules = {layer: LayerRule.of(handed, max_seq_len) for layer, handed in self.handed.items()}
        self.rules = {layer: rule for layer, rule in rules.items() if rule is not None}
        if self.device.type == "cpu":  # see DecodeWorkspace; on a GPU gathering the blocks is cheap
            budget = max(self.cache.memory_bytes() // 2, 256 << 20)
            self.workspace = DecodeWorkspace(self.cache, max_num_seqs, max_seq_len, budget)

    def memory_bytes(self) -> int:
        return self.cache.memory_bytes()

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        self.cache.copy_blocks(pairs)

    def reset(self) -> None:
        if self.workspace is not None:
            self.workspace.reset()

    def on_fused_projections(self) -> None:
        # SDPA's own GQA path is 5x slower on CPU (bf16, one query per sequence); the folded one
        # differs from it by bf16 rounding (`worker/fused.py`).
        self.fold_gqa = True

    # -- one step --------------------------------------------------------------------------------
    def plan_decodes(
        self, seq_ids: list[int], num_computed: list[int], block_tables: list[list[int]], num_new: list[int]
    ) -> DecodePlan:
        """In workspace row order, when the decodes read the workspace (its rows to fill as state)."""
        plan = None
        if self.workspace and seq_ids:
            plan = self.workspace.prepare(seq_ids, num_computed, block_tables, num_new, self.block_size)
        if plan is None:
            return DecodePlan(list(range(len(seq_ids))))
        order, fills = plan
        return DecodePlan(order, fills)

    def build_metadata(self, step: PackedStep) -> SdpaMetadata:
        fills = step.decode_plan.state if step.decode_plan is not None else None
        windows = {rule.window for rule in self.rules.values() if rule.window}
        return sdpa_metadata.build(step, self.cache, fills, windows)

    def forward(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        handed: Mapping[str, object] = NOTHING,
    ) -> torch.Tensor:
        meta: SdpaMetadata | paged.PagedMetadata = self.metadata
        layer = module.layer_idx
        gqa = query.shape[1] != key.shape[1]
        k_pool, v_pool = self.cache.keys[layer], self.cache.values[layer]
        k_pool.index_copy_(0, meta.slot_mapping, key[0].transpose(0, 1))
        v_pool.index_copy_(0, meta.slot_mapping, value[0].transpose(0, 1))
        if isinstance(meta, paged.PagedMetadata):  # a decode graph's step: static shapes
            q = query[0].transpose(0, 1)
            return paged.attend(q, k_pool, v_pool, meta, self.block_size, scaling)[None]
        rule = self.rules.get(layer)  # None for a plain layer: SDPA under the causal masks
        attend, masks = (F.scaled_dot_product_attention, None) if rule is None else _ruled(rule, meta, handed)
        outputs = []
        if meta.num_decodes:
            outputs.append(self._decode(layer, meta, query, key, value, scaling, gqa, attend, masks))
        for i, part in enumerate(meta.prefills):
            q = query[:, :, part.offset : part.offset + part.length]
            mask = part.mask if masks is None else masks.prefills[i]
            if part.slots is None:  # the whole sequence is in this chunk: its own keys
                k = key[:, :, part.offset : part.offset + part.length]
                v = value[:, :, part.offset : part.offset + part.length]
            else:  # after a cached prefix: its blocks, with the causal mask shifted by the prefix
                k = k_pool[part.slots].transpose(0, 1)[None]
                v = v_pool[part.slots].transpose(0, 1)[None]
            out = attend(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scaling, enable_gqa=gqa)
            outputs.append(out[0].transpose(0, 1))  # [length, heads, head_dim]
        return torch.cat(outputs)[None] if len(outputs) > 1 else outputs[0][None]

    def _decode(
        self,
        layer: int,
        meta: SdpaMetadata,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        gqa: bool,
        attend: Callable[..., torch.Tensor],
        masks: Masks | None,
    ) -> torch.Tensor:
        """The decode tokens' attention output, [decode tokens, heads, head_dim]."""
        n, dq = meta.num_decodes, meta.decode_queries
        mask = meta.decode_mask if masks is None else masks.decode
        if meta.decode_positions is not None:  # rows [0, n) of the workspace, in place
            t = n if dq is None else dq.num_tokens  # decode tokens
            ws = self.workspace
            if meta.workspace_fills:
                ws.fill(layer, meta.workspace_fills)
            rows = torch.arange(n, device=query.device) if dq is None else dq.rows
            k_rows, v_rows = ws.keys[layer], ws.values[layer]
            k_rows[rows, :, meta.decode_positions] = key[0, :, :t].transpose(0, 1)
            v_rows[rows, :, meta.decode_positions] = value[0, :, :t].transpose(0, 1)
            k = k_rows[:n, :, : meta.decode_length]
            v = v_rows[:n, :, : meta.decode_length]
        else:  # gather their blocks: [batch, kv_heads, length, head_dim]
            k = self.cache.keys[layer][meta.decode_slots].transpose(1, 2)
            v = self.cache.values[layer][meta.decode_slots].transpose(1, 2)
        heads, dim = query.shape[1], query.shape[3]
        if dq is None and gqa and self.fold_gqa:  # [batch, kv_heads, group, head_dim]
            # A group's query heads share their keys and, one query each, a position: they are
            # rows of one query of their key head.
            q = query[0, :, :n].transpose(0, 1).reshape(n, key.shape[1], -1, dim)
            out = attend(q, k, v, attn_mask=mask, scale=scaling)
            return out.reshape(n, heads, dim)
        if dq is None:  # one query each: [batch, heads, 1, head_dim]
            q = query[0, :, :n].transpose(0, 1).unsqueeze(2)
            out = attend(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)
            return out.squeeze(2)  # [batch, heads, head_dim]
        # padded to [batch, heads, width, head_dim], then back to the decode tokens
        q = query[0][:, dq.gather].view(heads, n, dq.width, dim).transpose(0, 1)
        out = attend(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(n * dq.width, heads, dim)[dq.scatter]


def _ruled(
    rule: LayerRule, meta: SdpaMetadata, handed: Mapping[str, object]
) -> tuple[Callable[..., torch.Tensor], Masks | None]:
    """A ruled layer's attention function (SDPA unless it caps or sinks) and masks (its window's)."""
    attend = F.scaled_dot_product_attention
    if rule.softcap is not None or rule.sinks:
        sinks = handed["s_aux"] if rule.sinks else None
        attend = functools.partial(explicit.attention, softcap=rule.softcap, sinks=sinks)
    return attend, None if rule.window is None else meta.windows[rule.window]
