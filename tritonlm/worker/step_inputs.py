"""Packs one step's work (a `StepBatch`) into the model's inputs: token ids, positions, embedding
rows to put in place of some ids, and the `PackedStep` the attention backend builds its metadata
from.

Each sequence feeds its `token_ids` (prompt, then output, then its proposals for this step) from
position `num_computed`. Decoding sequences (those feeding their pending token, and maybe proposals
after it) come first, in the order the backend asks for (`AttentionBackend.plan_decodes`), so they
can share one batched attention call; prefill chunks follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tritonlm.step import StepBatch
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


def is_decode(n: int, num_logits: int) -> bool:
    """One token, or the pending token followed by proposals (every fed token is sampled)."""
    return n == 1 or num_logits == n


def build(batch: StepBatch, backend: AttentionBackend) -> StepInputs:
    """Packs the step's tokens (their slots already allocated)."""
    bs = backend.block_size
    num_new, computed, tables, fed = batch.num_new, batch.num_computed, batch.block_tables, batch.token_ids
    decodes: list[int] = []
    prefills: list[int] = []
    for i, (n, m) in enumerate(zip(num_new, batch.num_logits, strict=True)):
        (decodes if is_decode(n, m) else prefills).append(i)
    plan = None
    if decodes:
        plan = backend.plan_decodes(
            [batch.seq_ids[i] for i in decodes],
            [computed[i] for i in decodes],
            [tables[i] for i in decodes],
            [num_new[i] for i in decodes],
        )
        decodes = [decodes[j] for j in plan.order]

    tokens: list[int] = []
    positions: list[int] = []
    slot_list: list[int] = []
    embed_at: list[int] = []
    embed_rows: list[torch.Tensor] = []
    for i in decodes:
        k, p = num_new[i], computed[i]
        if i in batch.embeds:
            _embeddings(batch, i, len(tokens), embed_at, embed_rows)
        if k == 1:  # the common case, kept lean
            tokens.append(fed[i][0])
            positions.append(p)
            slot_list.append(slot(tables[i], p, bs))
        else:
            tokens.extend(fed[i])
            positions.extend(range(p, p + k))
            slot_list.extend(slot(tables[i], q, bs) for q in range(p, p + k))

    chunks_ids = [torch.tensor(tokens, dtype=torch.long)]
    chunks_pos = [torch.tensor(positions, dtype=torch.long)]
    chunks_slots = [torch.tensor(slot_list, dtype=torch.long)]
    offset = len(tokens)
    for i in prefills:
        n, start = num_new[i], computed[i]
        if i in batch.embeds:
            _embeddings(batch, i, offset, embed_at, embed_rows)
        chunks_ids.append(torch.tensor(fed[i], dtype=torch.long))
        chunks_pos.append(torch.arange(start, start + n))
        chunks_slots.append(slots(tables[i], start, start + n, bs))
        offset += n

    order = decodes + prefills
    position_ids = torch.cat(chunks_pos)
    packed = PackedStep(
        num_computed=[computed[i] for i in order],
        block_tables=[tables[i] for i in order],
        num_new=[num_new[i] for i in order],
        num_decodes=len(decodes),
        position_ids=position_ids,
        slot_mapping=torch.cat(chunks_slots),
        decode_plan=plan,
    )
    return StepInputs(order, torch.cat(chunks_ids), position_ids, packed, embed_at, embed_rows)


def _embeddings(batch: StepBatch, i: int, offset: int, at: list[int], rows: list[torch.Tensor]) -> None:
    """Adds sequence i's embedding rows, its new tokens fed from packed index `offset`."""
    embeds = batch.embeds[i]
    at.extend(offset + j for j in embeds.at)
    rows.append(embeds.rows)
