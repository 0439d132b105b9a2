"""Packs one step's work into the model's inputs: token ids, positions, embedding rows to put in
place of some ids, and the `StepLayout` the attention reads.

Each sequence feeds the tokens [num_computed, num_computed + n) of its stream: prompt, then output,
then its proposals (`Sequence.spec_tokens`) for this step. Decoding sequences (those feeding their
pending token, and maybe proposals after it) come first, in workspace row order on CPU, so they
share one batched attention call; prefill chunks follow, one attention call each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonlm.engine.sequence import Sequence
from tritonlm.worker.kv_cache import DecodeQueries, PagedKVCache, PrefillPart, StepLayout


@dataclass
class StepInputs:
    order: list[int]  # the sequences' indices in packed order
    input_ids: torch.Tensor  # [tokens], on the CPU
    position_ids: torch.Tensor  # [tokens], on the CPU
    layout: StepLayout
    # Packed tokens fed an embedding row instead of their (placeholder) id, and those rows (CPU).
    embed_at: list[int] = field(default_factory=list)
    embed_rows: list[torch.Tensor] = field(default_factory=list)


def fed_tokens(seq: Sequence, start: int, end: int) -> list[int]:
    """Tokens [start, end) of what `seq` feeds: prompt + output + this step's proposals."""
    n = seq.num_tokens
    if end <= n:
        return seq.token_slice(start, end)
    return [*seq.token_slice(min(start, n), n), *seq.spec_tokens[max(start - n, 0) : end - n]]


def is_decode(seq: Sequence, n: int) -> bool:
    """One token, or the pending token followed by proposals."""
    return n == 1 or seq.num_computed + 1 == seq.num_tokens


def build(seqs: list[Sequence], num_new: list[int], cache: PagedKVCache) -> StepInputs:
    """Packs `num_new[i]` tokens of each `seqs[i]` (their slots already allocated)."""
    bs = cache.block_size
    decodes: list[int] = []
    prefills: list[int] = []
    for i, n in enumerate(num_new):
        (decodes if is_decode(seqs[i], n) else prefills).append(i)
    workspace = cache.workspace
    plan = (
        workspace.prepare([seqs[i] for i in decodes], [num_new[i] for i in decodes], bs)
        if workspace and decodes
        else None
    )
    rows, fills = plan if plan is not None else (None, [])
    if rows is not None:  # in workspace row order
        decodes = [decodes[j] for j in rows]

    tokens: list[int] = []
    positions: list[int] = []
    slot_list: list[int] = []
    embed_at: list[int] = []
    embed_rows: list[torch.Tensor] = []
    for i in decodes:
        seq, k = seqs[i], num_new[i]
        p = seq.num_computed
        if seq.request.prompt_embeds is not None:
            _embeddings(seq, p, p + k, len(tokens), embed_at, embed_rows)
        if k == 1:  # the common case, kept lean
            tokens.append(seq.token_slice(p, p + 1)[0])
            positions.append(p)
            slot_list.append(seq.block_table[p // bs] * bs + p % bs)
        else:
            fed = fed_tokens(seq, p, p + k)
            assert len(fed) == k, f"{k} tokens scheduled, {len(fed)} to feed"
            tokens.extend(fed)
            positions.extend(range(p, p + k))
            slot_list.extend(seq.block_table[q // bs] * bs + q % bs for q in range(p, p + k))
    position_ids = torch.tensor(positions, dtype=torch.long)

    chunks_ids = [torch.tensor(tokens, dtype=torch.long)]
    chunks_pos = [position_ids]
    chunks_slots = [torch.tensor(slot_list, dtype=torch.long)]
    parts: list[PrefillPart] = []
    offset = len(tokens)
    for i in prefills:
        seq, n = seqs[i], num_new[i]
        start = seq.num_computed
        if seq.request.prompt_embeds is not None:
            _embeddings(seq, start, start + n, offset, embed_at, embed_rows)
        table = torch.tensor(seq.block_table, dtype=torch.long)
        pos = torch.arange(start + n)
        all_slots = table[pos // bs] * bs + pos % bs
        chunks_ids.append(torch.tensor(fed_tokens(seq, start, start + n), dtype=torch.long))
        chunks_pos.append(pos[start:])
        chunks_slots.append(all_slots[start:])
        if start == 0:
            parts.append(PrefillPart(offset, n, 0, None, None))
        else:
            mask = pos[None, :] <= pos[start:, None]
            parts.append(PrefillPart(offset, n, start, all_slots.to(cache.device), mask.to(cache.device)))
        offset += n

    layout = StepLayout(
        slot_mapping=torch.cat(chunks_slots).to(cache.device),
        num_decodes=len(decodes),
        prefills=parts,
        workspace_fills=fills,
        **_decode_layout(seqs, decodes, num_new, position_ids, rows is not None, cache),
    )
    return StepInputs(
        decodes + prefills, torch.cat(chunks_ids), torch.cat(chunks_pos), layout, embed_at, embed_rows
    )


def _decode_layout(
    seqs: list[Sequence],
    decodes: list[int],
    num_new: list[int],
    position_ids: torch.Tensor,
    on_workspace: bool,
    cache: PagedKVCache,
) -> dict[str, object]:
    """The `StepLayout` fields of the decoding sequences: what their batched attention reads."""
    device, bs = cache.device, cache.block_size
    num_decodes = len(decodes)
    lengths = [seqs[i].num_computed + num_new[i] for i in decodes]
    decode_slots = decode_mask = decode_positions = queries = valid = None
    longest = max(lengths, default=0)
    if position_ids.shape[0] != num_decodes:  # some decode feeds proposals: one query row per token
        widths = [num_new[i] for i in decodes]
        queries, valid, decode_mask = _decode_queries(widths, lengths, longest, device)
    elif num_decodes and min(lengths) != longest:
        valid = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
        decode_mask = valid[:, None, None, :].to(device)
    if on_workspace:
        decode_positions = position_ids.to(device)
    elif num_decodes:
        width = -(-longest // bs)
        null_block = cache.num_blocks
        table = torch.tensor(
            [
                seqs[i].block_table[:width] + [null_block] * (width - len(seqs[i].block_table[:width]))
                for i in decodes
            ]
        )
        decode_slots = (table[:, :, None] * bs + torch.arange(bs)).reshape(num_decodes, -1)[:, :longest]
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
    mask = keys[None, None, :] <= ((ends - w)[:, None] + j)[:, :, None]
    return queries, valid, mask[:, None].to(device)


def _embeddings(
    seq: Sequence, start: int, end: int, offset: int, at: list[int], rows: list[torch.Tensor]
) -> None:
    """Adds the embedding rows of `seq`'s positions [start, end), fed from packed index `offset`."""
    embeds = seq.request.prompt_embeds
    a, b = embeds.span(start, end)
    if a < b:
        at.extend(offset + embeds.positions[j] - start for j in range(a, b))
        rows.append(embeds.rows[a:b])
