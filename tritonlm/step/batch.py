"""One forward step's work as plain data: per scheduled sequence (in the scheduler's order) what it
feeds, where its keys/values go, which logits rows it wants and its LoRA adapter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch


class EmbedRows(NamedTuple):
    """Rows fed in place of some of a sequence's new tokens' ids (prompt embeddings)."""

    at: list[int]  # indices among the sequence's new tokens of this step
    rows: torch.Tensor  # [len(at), hidden], on the CPU


@dataclass
class StepBatch:
    """Sequence i feeds `token_ids[i]` (`num_new[i]` tokens: prompt, output, then proposals) at
    positions [num_computed[i], num_computed[i] + num_new[i]); its blocks (`block_tables[i]`) are
    already allocated, and the copy-on-write block pairs `copies` are applied first. A table entry
    equal to the cache's block count (`kv_cache_blocks`) is a block released behind every layer's
    sliding window (`Worker.kv_window`): the pool's zero null block, which only masked positions
    read. The model returns the logits of its last `num_logits[i]` new tokens, and with
    `prompt_logits[i]` those of all of them. For a model with recurrent layers
    (`Worker.state_slots`), `state_slots[i]` is the sequence's slot of recurrent state, which a
    first chunk (`num_computed[i]` 0) starts afresh and later steps continue; -1 otherwise; the
    slot pairs `state_copies` (a fork's parent, child) are copied first, in order. Lists are read,
    never changed, by the worker."""

    seq_ids: list[int] = field(default_factory=list)  # stable per sequence across steps
    num_computed: list[int] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    num_logits: list[int] = field(default_factory=list)
    prompt_logits: list[bool] = field(default_factory=list)
    loras: list[object | None] = field(default_factory=list)  # a LoRA adapter handle, or None
    embeds: dict[int, EmbedRows] = field(default_factory=dict)  # sequence index -> its rows
    copies: list[tuple[int, int]] = field(default_factory=list)
    state_slots: list[int] = field(default_factory=list)
    state_copies: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seq_ids)

    def add(
        self,
        seq_id: int,
        num_computed: int,
        token_ids: list[int],
        block_table: list[int],
        num_logits: int,
        prompt_logits: bool = False,
        lora: object | None = None,
        state_slot: int = -1,
    ) -> None:
        """Appends one sequence's work."""
        self.seq_ids.append(seq_id)
        self.num_computed.append(num_computed)
        self.num_new.append(len(token_ids))
        self.token_ids.append(token_ids)
        self.block_tables.append(block_table)
        self.num_logits.append(num_logits)
        self.prompt_logits.append(prompt_logits)
        self.loras.append(lora)
        self.state_slots.append(state_slot)
