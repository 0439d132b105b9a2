"""`ModelPath`: the code that runs one forward step of the model over a packed batch.

Every path reads the same modules and weights the runner loaded (transformers' model, with the
projections of `worker/fused.py` where the platform fuses) and computes attention through the
attention backend inside its `step`; they differ in how they walk the layers. `generic.py` walks
transformers' own modules and serves every architecture; a fast path (`decoder_stack.py`) walks a
family's layers straight over the fused modules and must give the generic path's logits."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from tritonlm.platforms.base import Platform
from tritonlm.worker.attention.base import AttentionBackend


@dataclass
class ForwardInputs:
    """One packed step's inputs: token ids `[tokens]` (or their `embeds` `[tokens, hidden]`) at
    `positions` `[tokens]`, the packed tokens whose logits are wanted (`keep`), and per packed
    sequence i its `rows[i]` tokens' LoRA adapter `adapters[i]` (None: none)."""

    input_ids: torch.Tensor
    embeds: torch.Tensor | None
    positions: torch.Tensor
    keep: list[int]
    adapters: Sequence[object | None]
    rows: Sequence[int]


class ModelPath(ABC):
    name: str = ""
    # Whether the path runs steps whose rows carry LoRA adapters (their hooks sit on the projection
    # modules, which a fast path may not call); the runner takes the generic path for those.
    runs_lora: bool = False

    @classmethod
    @abstractmethod
    def build(cls, model: nn.Module, attention: AttentionBackend, platform: Platform) -> ModelPath | str:
        """The path over `model` (loaded, fused where the platform fuses), or why it cannot run it."""

    @abstractmethod
    def __call__(self, inputs: ForwardInputs) -> torch.Tensor:
        """The logits `[len(inputs.keep), vocab]`, inside the attention backend's `step`."""
