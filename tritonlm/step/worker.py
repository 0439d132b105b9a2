"""What the engine asks of a worker, and what one step gives back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from tritonlm.config import EngineConfig
from tritonlm.step.batch import StepBatch


@dataclass
class ModelOutput:
    # The sampled rows, in the order of the step's sequences: one per sampled sequence when
    # `num_logits` is all 0/1 (so [sequences sampled, vocab]); those of sequence i are rows
    # [offsets[i], offsets[i + 1]).
    logits: torch.Tensor
    all_logits: dict[int, torch.Tensor]  # index of a `prompt_logits` sequence -> [its new tokens, vocab]
    offsets: list[int] = field(default_factory=list)

    def logits_of(self, i: int) -> torch.Tensor:
        """The sampled rows of the i-th sequence, its last new token last."""
        return self.logits[self.offsets[i] : self.offsets[i + 1]]


class Worker(Protocol):
    """Runs the model: one `StepBatch` in, its logits out. Built above the engine (serving, tests)
    and handed to it."""

    config: EngineConfig  # resolved: max_seq_len and kv_cache_blocks are concrete numbers
    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    # The widest sliding window when every attention layer has one: no query reads keys at or
    # before its position minus this, so the engine releases blocks wholly that far behind
    # (`BlockManager.slide`). None when some layer attends to the whole sequence: nothing is released.
    kv_window: int | None
    # Recurrent-state slots (a model with linear-attention layers: one per running sequence, which
    # the engine hands out like blocks, `StepBatch.state_slots`); 0 for a model without such layers.
    state_slots: int

    def execute(self, step: StepBatch) -> ModelOutput: ...

    def reset(self) -> None:
        """Forgets per-step state kept across steps (after a failed step)."""
