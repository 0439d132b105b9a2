"""The SDPA backend's step metadata: index tensors and masks built once per step, read by every layer.

Decoding sequences (their new tokens first in the packed batch) share one batched attention call:
their cached keys/values are gathered into a padded `[batch, kv_heads, length, head_dim]` view
(`decode_slots`), or, on CPU, read in place from their `DecodeWorkspace` rows (`decode_positions`).
With one query each, the common case, the queries are `[batch, heads, 1, head_dim]`; when some
sequence feeds k > 1 tokens (proposals to verify) they are padded to `[batch, heads, k_max,
head_dim]` (`DecodeQueries`; a pad row repeats the sequence's last token and is dropped after) and
the mask is per query row: query j sees the cached prefix and the new tokens up to j (causal).
Each prefill chunk gets a call of its own (`PrefillPart`). Layers with a sliding window read the
same views under masks of their own (`Masks`, one per window size: a query at position p sees
p - W < k <= p).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonlm.worker.attention.base import PackedStep, slots
from tritonlm.worker.kv_cache import PagedKVCache


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
class Masks:
    """The keys each query sees under a sliding window: the decodes' and each prefill chunk's."""

    decode: torch.Tensor | None  # [num_decodes, 1, queries, max_len], as `SdpaMetadata.decode_mask`
    prefills: list[torch.Tensor]  # per PrefillPart: [length, start + length]


@dataclass
class SdpaMetadata:
    """Where every token of one packed forward step goes."""

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
    windows: dict[int, Masks] = field(default_factory=dict)  # per window size the layers use


def sees(queries: torch.Tensor, keys: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """Which keys each query sees, by position (broadcast): causal, and within `window` if any."""
    seen = keys <= queries
    return seen if window is None else seen & (keys > queries - window)


def build(
    step: PackedStep,
    cache: PagedKVCache,
    fills: list[tuple[int, torch.Tensor]] | None,
    windows: set[int] = frozenset(),
) -> SdpaMetadata:
    """The metadata of `step`; `fills`: the decodes read the workspace (its rows to fill), None: they
    gather their blocks; `windows`: the layers' sliding-window sizes, each masked its own way."""
    device, bs = cache.device, cache.block_size
    n = step.num_decodes
    parts: list[PrefillPart] = []
    offset = sum(step.num_new[:n])
    for start, table, length in zip(
        step.num_computed[n:], step.block_tables[n:], step.num_new[n:], strict=True
    ):
        if start == 0:
            parts.append(PrefillPart(offset, length, 0, None, None))
        else:
            pos = torch.arange(start + length)
            mask = sees(pos[start:, None], pos)
            all_slots = slots(table, 0, start + length, bs)
            parts.append(PrefillPart(offset, length, start, all_slots.to(device), mask.to(device)))
        offset += length
    meta = SdpaMetadata(
        slot_mapping=step.slot_mapping.to(device),
        num_decodes=n,
        prefills=parts,
        workspace_fills=fills or [],
        **_decode_fields(step, fills is not None, cache),
    )
    meta.windows = {w: _window_masks(step, parts, w, meta.decode_length, device) for w in windows}
    return meta


def _window_masks(
    step: PackedStep, parts: list[PrefillPart], window: int, longest: int, device: torch.device
) -> Masks:
    """The masks of layers with a sliding window of `window` (keys indexed by position, as above)."""
    n = step.num_decodes
    decode = None
    if n:  # query row j of decoding sequence i at position first_i + min(j, k_i - 1), as padded
        widths, first = torch.tensor(step.num_new[:n]), torch.tensor(step.num_computed[:n])
        j = torch.minimum(torch.arange(int(widths.max()))[None, :], (widths - 1)[:, None])
        decode = sees((first[:, None] + j)[:, None, :, None], torch.arange(longest), window).to(device)
    prefills = []
    for part in parts:
        pos = torch.arange(part.start + part.length)
        prefills.append(sees(pos[part.start :, None], pos, window).to(device))
    return Masks(decode, prefills)


def _decode_fields(step: PackedStep, on_workspace: bool, cache: PagedKVCache) -> dict[str, object]:
    """The fields of the decoding sequences: what their batched attention reads."""
    device, bs = cache.device, cache.block_size
    n = step.num_decodes
    tables, widths = step.block_tables[:n], step.num_new[:n]
    lengths = [p + k for p, k in zip(step.num_computed[:n], widths, strict=True)]
    decode_slots = decode_mask = decode_positions = queries = valid = None
    longest = max(lengths, default=0)
    num_tokens = sum(widths)
    if num_tokens != n:  # some decode feeds proposals: one query row per token
        queries, valid, decode_mask = _decode_queries(widths, lengths, longest, device)
    elif n and min(lengths) != longest:
        valid = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
        decode_mask = valid[:, None, None, :].to(device)
    if on_workspace:
        decode_positions = step.position_ids[:num_tokens].to(device)
    elif n:
        width = -(-longest // bs)
        table = torch.tensor([t[:width] + [cache.num_blocks] * (width - len(t[:width])) for t in tables])
        decode_slots = (table[:, :, None] * bs + torch.arange(bs)).reshape(n, -1)[:, :longest]
        if valid is not None:
            decode_slots = decode_slots.masked_fill(~valid, cache.null_slot)
        decode_slots = decode_slots.to(device)
    return {
        "decode_slots": decode_slots,
        "decode_mask": decode_mask,
        "decode_positions": decode_positions,
        "decode_length": longest,
        "decode_queries": queries,
    }


def _decode_queries(
    widths: list[int], lengths: list[int], longest: int, device: torch.device
) -> tuple[DecodeQueries, torch.Tensor, torch.Tensor]:
    """Padded queries for decoding sequences feeding `widths[i]` tokens that end at `lengths[i]`;
    also the keys each sequence holds ([n, longest], on the CPU) and each query row's mask
    ([n, 1, width, longest]: causal, shifted by its cached prefix)."""
    n, width = len(widths), max(widths)
    w, ends = torch.tensor(widths), torch.tensor(lengths)
    first = torch.cumsum(w, 0) - w  # packed index of each sequence's first decode token
    # Query row j of sequence i is its token min(j, k_i - 1): pad rows repeat its last token, so
    # they see real keys (no all-masked row) and are dropped afterwards.
    j = torch.minimum(torch.arange(width)[None, :], (w - 1)[:, None])
    seq_of = torch.repeat_interleave(torch.arange(n), w)
    total = int(w.sum())
    scatter = seq_of * width + torch.arange(total) - first[seq_of]
    gather = (first[:, None] + j).reshape(-1)
    queries = DecodeQueries(total, width, gather.to(device), scatter.to(device), seq_of.to(device))
    keys = torch.arange(longest)
    valid = keys[None, :] < ends[:, None]
    mask = sees(((ends - w)[:, None] + j)[:, :, None], keys)
    return queries, valid, mask[:, None].to(device)
