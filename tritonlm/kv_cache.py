"""A slot-based KV cache and the attention function that reads and writes it.

Every running sequence owns one slot: row `slot` of a per-layer tensor
`[num_slots, kv_heads, max_seq_len, head_dim]`. The model runs on a *packed* batch (all new tokens of
all sequences in one row, no padding); this module's attention function, registered with
transformers' AttentionInterface, writes each sequence's new keys/values into its slot and attends
over that sequence's own history. Any transformers decoder whose attention goes through the
interface (Llama, Qwen2, Mistral, GPT-2 …) works unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

ATTENTION_NAME = "tritonlm_slots"


@dataclass
class StepLayout:
    """Where each sequence's tokens sit in the packed batch of one forward step."""

    slots: list[int]  # cache slot of each sequence
    starts: list[int]  # tokens already cached for each sequence (its position offset)
    lengths: list[int]  # new tokens of each sequence in this step
    device: torch.device

    def __post_init__(self) -> None:
        self.all_decode = all(n == 1 for n in self.lengths)
        if self.all_decode:  # tensors for the batched decode path, built once per step
            self.slot_index = torch.tensor(self.slots, device=self.device)
            self.pos_index = torch.tensor(self.starts, device=self.device)
            self.kv_len = max(self.starts) + 1
            # mask[b, 0, 0, j]: may sequence b attend to cache position j
            self.mask = (torch.arange(self.kv_len, device=self.device)[None, :] <= self.pos_index[:, None])[
                :, None, None, :
            ]

    def position_ids(self) -> torch.Tensor:
        ids = [torch.arange(s, s + n) for s, n in zip(self.starts, self.lengths, strict=True)]
        return torch.cat(ids)[None, :].to(self.device)


class SlotKVCache:
    def __init__(self, num_slots: int, max_seq_len: int, dtype: torch.dtype, device: torch.device):
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.dtype = dtype
        self.device = device
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [slots, kv_heads, max_seq_len, head_dim]
        self.values: dict[int, torch.Tensor] = {}
        self.layout: StepLayout | None = None  # set by the runner around each forward

    def _layer(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if layer not in self.keys:  # allocated on first use: head counts differ between architectures
            shape = (self.num_slots, like.shape[1], self.max_seq_len, like.shape[3])
            self.keys[layer] = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.values[layer] = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return self.keys[layer], self.values[layer]

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values()))

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
        layout = self.layout
        assert layout is not None, "attention called outside a runner step"
        k_cache, v_cache = self._layer(module.layer_idx, key)
        gqa = query.shape[1] != key.shape[1]
        if layout.all_decode:
            # One token per sequence: write all at once, then one batched attention over the slots.
            k_cache[layout.slot_index, :, layout.pos_index] = key[0].transpose(0, 1)
            v_cache[layout.slot_index, :, layout.pos_index] = value[0].transpose(0, 1)
            q = query[0].transpose(0, 1).unsqueeze(2)  # [batch, heads, 1, head_dim]
            k = k_cache[layout.slot_index, :, : layout.kv_len]
            v = v_cache[layout.slot_index, :, : layout.kv_len]
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=layout.mask, scale=scaling, enable_gqa=gqa
            )
            return out.squeeze(2).unsqueeze(0), None  # [1, tokens, heads, head_dim]
        outputs = []
        offset = 0
        for slot, start, n in zip(layout.slots, layout.starts, layout.lengths, strict=True):
            q = query[:, :, offset : offset + n]
            k_cache[slot, :, start : start + n] = key[0, :, offset : offset + n]
            v_cache[slot, :, start : start + n] = value[0, :, offset : offset + n]
            if start == 0:  # a whole prompt: plain causal attention over its own keys
                k, v = key[:, :, offset : offset + n], value[:, :, offset : offset + n]
                out = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1, scale=scaling, enable_gqa=gqa)
            else:  # new tokens after a cached prefix: causal mask shifted by the prefix length
                k = k_cache[slot : slot + 1, :, : start + n]
                v = v_cache[slot : slot + 1, :, : start + n]
                rows = torch.arange(start, start + n, device=query.device)[:, None]
                mask = torch.arange(start + n, device=query.device)[None, :] <= rows
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)
            outputs.append(out)
            offset += n
        return torch.cat(outputs, dim=2).transpose(1, 2), None


def _no_mask(*args: object, **kwargs: object) -> None:
    # The attention function builds its own per-sequence masks from the step layout.
    return None


def register(cache: SlotKVCache) -> str:
    """Registers `cache.attention` under a name to pass as the model's attn_implementation."""
    AttentionInterface.register(ATTENTION_NAME, cache.attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME
