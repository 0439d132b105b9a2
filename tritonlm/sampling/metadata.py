"""What the sampler needs of one engine step, besides the logits: per sampled sequence its rows
(each row's `SamplerInput`, with the prefix that row sees), the proposals those rows verify and a
client's draft distribution; the rows of beams (their group decides); and the prompt positions
whose log probs are wanted. Built from the scheduler's step by `SamplingMetadata.of_step`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from tritonlm.sampling.params import SamplerInput, SamplingParams

if TYPE_CHECKING:
    from tritonlm.engine.scheduler import SchedulerOutput


@dataclass
class SeqRows:
    """One sampled sequence's rows of the step's logits: row j predicts the token after its j-th
    fed token, processed as if `proposals[:j]` followed its output."""

    index: int  # the sequence's place in the step (SchedulerOutput.seqs)
    inputs: list[SamplerInput]  # one per row: 1 + len(proposals)
    proposals: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None  # [len(proposals), vocab]: a client's drafter's distribution
    threshold: float | None = None  # replaces the acceptance rule's uniform draw

    @property
    def params(self) -> SamplingParams:
        return self.inputs[0].params


@dataclass
class PromptRows:
    """Logits of a sequence's prompt positions [start, start + len(logits)) that it has not taken
    before (a recompute after a preemption feeds them again); `targets` are the prompt ids after
    each of them (one fewer when the rows reach the prompt's last position)."""

    index: int
    start: int
    logits: torch.Tensor  # [rows, vocab], as the model made them
    targets: tuple[int, ...]
    params: SamplingParams


@dataclass
class SamplingMetadata:
    seqs: list[SeqRows]  # in the order of their rows in the logits
    rows: list[int] | None = None  # which rows of the step's logits they are; None: all, in order
    beams: dict[int, int] = field(default_factory=dict)  # a beam's place in the step -> its last row
    prompts: list[PromptRows] = field(default_factory=list)

    @property
    def inputs(self) -> list[SamplerInput]:
        return [s for seq in self.seqs for s in seq.inputs]

    @classmethod
    def of_inputs(cls, inputs: list[SamplerInput]) -> SamplingMetadata:
        """One row per sequence, nothing to verify: a step of plain decodes."""
        return cls([SeqRows(i, [s]) for i, s in enumerate(inputs)])

    @classmethod
    def of_step(cls, batch: SchedulerOutput, prompt_logits: dict[int, torch.Tensor]) -> SamplingMetadata:
        """The step's metadata, before the sequences' `num_computed` advance. The step's logits hold
        `batch.num_logits[i]` rows per sequence, in order; `prompt_logits[i]`: all the rows of
        the new tokens of sequence i (`batch.prompt_logits`)."""
        seqs: list[SeqRows] = []
        rows: list[int] = []
        beams: dict[int, int] = {}
        offset = 0
        for i, (seq, m) in enumerate(zip(batch.seqs, batch.num_logits, strict=True)):
            if m and seq.group is not None:
                beams[i] = offset + m - 1
            elif m:
                seqs.append(_seq_rows(i, seq, m))
                rows.extend(range(offset, offset + m))
            offset += m
        prompts = [_prompt_rows(i, batch.seqs[i], logits) for i, logits in prompt_logits.items()]
        every = rows == list(range(offset))
        return cls(seqs, None if every else rows, beams, [p for p in prompts if p is not None])


def _seq_rows(index: int, seq, m: int) -> SeqRows:
    proposals = seq.spec_tokens[: m - 1]
    inputs = [seq.sampler_input(proposals[:j]) for j in range(m)]
    draft = seq.request.draft if not seq.output_ids else None  # a client's drafts: the first step
    if m == 1 or draft is None:
        return SeqRows(index, inputs, proposals)
    probs = draft.probs[: m - 1] if draft.probs is not None else None
    return SeqRows(index, inputs, proposals, probs, draft.threshold)


def _prompt_rows(index: int, seq, logits: torch.Tensor) -> PromptRows | None:
    prompt = seq.prompt_ids
    first = seq.num_computed  # the chunk's first position
    start = max(seq.out.prompt_positions, first)
    rows = logits[start - first : len(prompt) - first]
    if not rows.shape[0]:
        return None
    end = start + rows.shape[0]
    return PromptRows(index, start, rows, tuple(prompt[start + 1 : end + 1]), seq.params)
