"""Attention written out (scores, cap, mask, softmax, values) for the layers torch's SDPA cannot
compute: soft-capped logits (Gemma 2) and attention sinks (gpt-oss). Called like
`F.scaled_dot_product_attention`, so a layer swaps one for the other; the softmax runs in float32,
as transformers' eager attention does."""

from __future__ import annotations

import torch


def attention(
    query: torch.Tensor,  # [..., heads, queries, head_dim]
    key: torch.Tensor,  # [..., kv_heads, keys, head_dim]
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,  # bool, broadcast to the scores: True where a key is seen
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [heads]: one more logit per query head, dropped after softmax
) -> torch.Tensor:
    if enable_gqa:
        group = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(group, -3), value.repeat_interleave(group, -3)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        attn_mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        # A head's sink by its score rows: [heads, 1, 1], or [kv_heads, group, 1] when the decode
        # folds a key head's query heads into its rows (heads = kv_heads * group, in that order).
        sink = sinks.reshape(scores.shape[-3], -1, 1).to(scores.dtype).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
    return torch.matmul(probs.to(value.dtype), value)
