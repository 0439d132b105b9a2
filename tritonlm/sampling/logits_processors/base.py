"""The logits-processor interface, and the pipeline that runs processors in order over a batch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import torch

from tritonlm.sampling.params import SamplerInput


class LogitsProcessor(Protocol):
    """One rule that changes next-token logits, for the rows of a batch that ask for it.

    The pipeline asks `concerns` of every row (cheap Python on the row's settings and tokens), then
    calls `apply` once with all the concerned rows. `apply` works in place on the whole batch's
    `logits` [batch, vocab] (float: raw logits when sampling, log probs in beam search), with tensor
    ops over `rows` only; every other row must stay untouched. `inputs[j]` is row `rows[j]`'s input.
    """

    def concerns(self, s: SamplerInput) -> bool: ...

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None: ...


class LogitsPipeline:
    """Processors in a fixed order; one that concerns no row of the batch costs one pass over the
    rows' settings and no tensor work."""

    def __init__(self, processors: Iterable[LogitsProcessor]):
        self.processors: tuple[LogitsProcessor, ...] = tuple(processors)

    def __call__(self, logits: torch.Tensor, batch: Sequence[SamplerInput]) -> torch.Tensor:
        """Runs every processor in place on `logits` [len(batch), vocab]; returns it."""
        for processor in self.processors:
            rows = [i for i, s in enumerate(batch) if processor.concerns(s)]
            if rows:
                processor.apply(logits, rows, [batch[i] for i in rows])
        return logits
