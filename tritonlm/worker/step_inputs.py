"""Packs one step's work into the model's inputs: token ids, positions, embedding rows to put in
place of some ids, and the `PackedStep` the attention backend builds its metadata from.

Each sequence feeds the tokens [num_computed, num_computed + n) of its stream: prompt, then output,
then its proposals (`Sequence.spec_tokens`) for this step. Decoding sequences (those feeding their
pending token, and maybe proposals after it) come first, in the order the backend asks for
(`AttentionBackend.plan_decodes`), so they can share one batched attention call; prefill chunks
follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonlm.engine.sequence import Sequence
from tritonlm.worker.attention.base import AttentionBackend, PackedStep, slot, slots


@dataclass
class StepInputs:
    order: list[int]  # the sequences' indices in packed order
    input_ids: torch.Tensor  # [tokens], on the CPU
    position_ids: torch.Tensor  # [tokens], on the CPU
    packed: PackedStep
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


def build(seqs: list[Sequence], num_new: list[int], backend: AttentionBackend) -> StepInputs:
    """Packs `num_new[i]` tokens of each `seqs[i]` (their slots already allocated)."""
    bs = backend.block_size
    decodes: list[int] = []
    prefills: list[int] = []
    for i, n in enumerate(num_new):
        (decodes if is_decode(seqs[i], n) else prefills).append(i)
    plan = None
    if decodes:
        plan = backend.plan_decodes([seqs[i] for i in decodes], [num_new[i] for i in decodes])
        decodes = [decodes[j] for j in plan.order]

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
            slot_list.append(slot(seq.block_table, p, bs))
        else:
            fed = fed_tokens(seq, p, p + k)
            assert len(fed) == k, f"{k} tokens scheduled, {len(fed)} to feed"
            tokens.extend(fed)
            positions.extend(range(p, p + k))
            slot_list.extend(slot(seq.block_table, q, bs) for q in range(p, p + k))

    chunks_ids = [torch.tensor(tokens, dtype=torch.long)]
    chunks_pos = [torch.tensor(positions, dtype=torch.long)]
    chunks_slots = [torch.tensor(slot_list, dtype=torch.long)]
    offset = len(tokens)
    for i in prefills:
        seq, n = seqs[i], num_new[i]
        start = seq.num_computed
        if seq.request.prompt_embeds is not None:
            _embeddings(seq, start, start + n, offset, embed_at, embed_rows)
        chunks_ids.append(torch.tensor(fed_tokens(seq, start, start + n), dtype=torch.long))
        chunks_pos.append(torch.arange(start, start + n))
        chunks_slots.append(slots(seq.block_table, start, start + n, bs))
        offset += n

    order = decodes + prefills
    position_ids = torch.cat(chunks_pos)
    packed = PackedStep(
        seqs=[seqs[i] for i in order],
        num_new=[num_new[i] for i in order],
        num_decodes=len(decodes),
        position_ids=position_ids,
        slot_mapping=torch.cat(chunks_slots),
        decode_plan=plan,
    )
    return StepInputs(order, torch.cat(chunks_ids), position_ids, packed, embed_at, embed_rows)


def _embeddings(
    seq: Sequence, start: int, end: int, offset: int, at: list[int], rows: list[torch.Tensor]
) -> None:
    """Adds the embedding rows of `seq`'s positions [start, end), fed from packed index `offset`."""
    embeds = seq.request.prompt_embeds
    a, b = embeds.span(start, end)
    if a < b:
        at.extend(offset + embeds.positions[j] - start for j in range(a, b))
        rows.append(embeds.rows[a:b])
