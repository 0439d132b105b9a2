"""`PagedMetadata`: what a paged reader needs of a step (each new token's cache slot, its sequence's
block table, how far it sees), and `attend`, the attention over it in plain torch ops.

`cpu_paged` reads this metadata with its C++ kernel; `sdpa` reads it with `attend` when a decode
graph's step hands it over (`worker/decode_graph.py`). `attend` gathers each token's whole table
(its fixed width, not its length) and masks what lies past the token's position, so its shapes
depend only on the table's width: a CUDA graph can capture it once per batch size. The price is a
gather of the table's full width every layer, where the eager decode gathers each sequence's
length."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PagedMetadata:
    """Where a step's tokens go and what each reads."""

    slot_mapping: torch.Tensor  # [tokens]: the cache slot of each new token
    tables: torch.Tensor  # [sequences, blocks], int32: the step's sequences' block tables
    row_seq: torch.Tensor  # [tokens], int32: each token's row of `tables`
    row_len: torch.Tensor  # [tokens], int32: the positions each token sees (its own included)


def attend(
    query: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    meta: PagedMetadata,
    block_size: int,
    scaling: float | None,
) -> torch.Tensor:
    """Each token's attention [tokens, heads, head_dim] (`query` [tokens, heads, head_dim]) over
    its sequence's cached keys and values (the pools: [slots, kv_heads, head_dim]), causal: up to
    its own position. Table entries past a token's length may name any block (the null block, a
    stale one): they are masked."""
    tables = meta.tables[meta.row_seq.long()].long()  # [tokens, width]
    offsets = torch.arange(block_size, device=tables.device)
    slots = (tables[:, :, None] * block_size + offsets).flatten(1)  # [tokens, width * block_size]
    k = k_pool[slots].transpose(1, 2)  # [tokens, kv_heads, keys, head_dim]
    v = v_pool[slots].transpose(1, 2)
    seen = torch.arange(slots.shape[1], device=slots.device) < meta.row_len[:, None]
    gqa = query.shape[1] != k.shape[1]
    out = F.scaled_dot_product_attention(
        query.unsqueeze(2), k, v, attn_mask=seen[:, None, None, :], scale=scaling, enable_gqa=gqa
    )
    return out.squeeze(2)
