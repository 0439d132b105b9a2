"""The paged KV cache and the attention function that reads and writes it.

Every layer has one pool of keys and one of values, `[num_blocks + 1, block_size, kv_heads,
head_dim]`; block `num_blocks` is a zero "null" block that pads gathers. Which blocks a sequence
owns is decided by `tritonlm.engine.block_manager`; the runner turns that into a `StepLayout` once per
forward step (index tensors only), and this module's attention function, registered with
transformers' AttentionInterface, uses it in every layer:

1. write the step's new keys/values into their slots (one `index_copy_` for the whole step);
2. decode tokens (the new tokens of decoding sequences, placed first in the packed batch): gather
   each sequence's cached keys/values into a padded `[batch, kv_heads, length, head_dim]` view (on
   CPU, read its `decode_workspace.DecodeWorkspace` row in place instead) and run one batched
   `scaled_dot_product_attention` with a length mask;
3. prefill chunks: per sequence, causal attention over its own new tokens, or over its cached prefix
   plus the new tokens (a later chunk, or a prompt whose prefix came from the prefix cache).

Several tokens per decoding sequence: a decoding sequence feeds its pending token and, when it has
proposals to verify (`Sequence.spec_tokens`), those after it, so k >= 1 queries. They stay in the
decode path (rather than going through a prefill chunk with a cached prefix): the sequence keeps
its workspace row and shares the one batched call. With one query each, the common case, the
queries are `[batch, heads, 1, head_dim]` exactly as before; when some sequence has k > 1 they are
padded to `[batch, heads, k_max, head_dim]` (`DecodeQueries`; a pad row repeats the sequence's last
token and is dropped after) and the mask is per query row: query j sees the cached prefix and the
new tokens up to j (causal). Rejected proposals leave stale keys/values in their slots, which are
given back (`BlockManager.rollback`) and overwritten before anyone reads them.

Any transformers decoder whose attention goes through the interface (Llama, Qwen2, Mistral, GPT-2 …)
works unchanged; grouped-query attention goes through SDPA's `enable_gqa`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

if TYPE_CHECKING:
    from tritonlm.worker.decode_workspace import DecodeWorkspace

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
class DecodeQueries:
    """How the decode tokens map to padded queries when some decoding sequence feeds k > 1 tokens:
    sequence i's tokens are query rows `[i * width, i * width + k_i)` of `[num_decodes * width]`."""

    num_tokens: int  # decode tokens at the head of the packed batch
    width: int  # the most tokens any decoding sequence feeds
    gather: torch.Tensor  # [num_decodes * width]: packed token of each query row (pads repeat one)
    scatter: torch.Tensor  # [num_tokens]: query row of each decode token
    rows: torch.Tensor  # [num_tokens]: decoding sequence (workspace row) of each decode token


@dataclass
class StepLayout:
    """Where every token of one packed forward step goes, built once per step by the runner."""

    slot_mapping: torch.Tensor  # [tokens]: cache slot of each new token
    num_decodes: int  # decoding sequences; their new tokens come first in the batch, in this order
    decode_slots: torch.Tensor | None  # [num_decodes, max_len]: slots to attend to (null-padded)
    # [num_decodes, 1, queries, max_len]: keys each query sees; None when every decoding sequence
    # feeds one token and all have the same length.
    decode_mask: torch.Tensor | None
    prefills: list[PrefillPart]
    # With the decode workspace instead of decode_slots: the position of each decode token (its row
    # is its sequence's index, see DecodeQueries.rows).
    decode_positions: torch.Tensor | None = None  # [decode tokens]
    decode_length: int = 0  # longest decoding sequence, this step's tokens included
    # Workspace rows to fill from the pool in each layer, after the step's keys/values are written
    # (a prefix cached in this very step is computed by another sequence of the step): (row, slots).
    workspace_fills: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    decode_queries: DecodeQueries | None = None  # None: one token per decoding sequence


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
        # Decode attention with one query per sequence folds GQA groups into the query length
        # (set by `fused.fuse`, the `fuse_projections` setting).
        self.fold_gqa = False

    @property
    def null_slot(self) -> int:
        return self.num_blocks * self.block_size

    def bytes_per_block(self, shapes: dict[int, tuple[int, int, torch.dtype]]) -> int:
        """Bytes one block takes over all layers, for the key shapes a probe recorded."""
        size = torch.tensor([], dtype=self.dtype).element_size()
        return sum(2 * self.block_size * heads * dim * size for heads, dim, _ in shapes.values())

    def allocate(self, num_blocks: int, shapes: dict[int, tuple[int, int, torch.dtype]]) -> None:
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
            dq = layout.decode_queries
            t = n if dq is None else dq.num_tokens  # decode tokens
            if layout.decode_positions is not None:  # rows [0, n) of the workspace, in place
                ws = self.workspace
                if layout.workspace_fills:
                    ws.fill(module.layer_idx, layout.workspace_fills)
                rows = torch.arange(n, device=query.device) if dq is None else dq.rows
                k_rows, v_rows = ws.keys[module.layer_idx], ws.values[module.layer_idx]
                k_rows[rows, :, layout.decode_positions] = key[0, :, :t].transpose(0, 1)
                v_rows[rows, :, layout.decode_positions] = value[0, :, :t].transpose(0, 1)
                k = k_rows[:n, :, : layout.decode_length]
                v = v_rows[:n, :, : layout.decode_length]
            else:  # gather their blocks: [batch, kv_heads, length, head_dim]
                k = k_pool[layout.decode_slots].transpose(1, 2)
                v = v_pool[layout.decode_slots].transpose(1, 2)
            if dq is None and gqa and self.fold_gqa:  # [batch, kv_heads, group, head_dim]
                # A group's query heads share their keys and, one query each, a position: they are
                # rows of one query of their key head (SDPA's own GQA path is 5x slower on CPU).
                heads, dim = query.shape[1], query.shape[3]
                q = query[0, :, :n].transpose(0, 1).reshape(n, key.shape[1], -1, dim)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.decode_mask, scale=scaling)
                outputs.append(out.reshape(n, heads, dim))
            elif dq is None:  # one query each: [batch, heads, 1, head_dim]
                q = query[0, :, :n].transpose(0, 1).unsqueeze(2)
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=layout.decode_mask, scale=scaling, enable_gqa=gqa
                )
                outputs.append(out.squeeze(2))  # [batch, heads, head_dim]
            else:  # padded to [batch, heads, width, head_dim], then back to the decode tokens
                heads, dim = query.shape[1], query.shape[3]
                q = query[0][:, dq.gather].view(heads, n, dq.width, dim).transpose(0, 1)
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=layout.decode_mask, scale=scaling, enable_gqa=gqa
                )
                outputs.append(out.transpose(1, 2).reshape(n * dq.width, heads, dim)[dq.scatter])
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
