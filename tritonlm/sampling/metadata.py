"""What the sampler needs of one engine step, besides the logits: per sampled sequence its rows
(each row's `SamplerInput`, with the prefix that row sees), the proposals those rows verify and a
client's draft distribution; the rows of beams (their group decides); and the prompt positions
whose log probs are wanted. Built by `SamplingMetadata.of_step` from `StepSamples`, the plain data
the engine fills from its sequences for each step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from tritonlm.sampling.params import SamplerInput, SamplingParams


class Draft(NamedTuple):
    """A client's drafter's view of a sequence's proposals (engine.request.DraftTokens)."""

    probs: torch.Tensor | None  # [proposals, vocab]
    threshold: float | None


class PromptSource(NamedTuple):
    """A sequence whose prompt logits the step keeps."""

    prompt_ids: tuple[int, ...]
    first: int  # the chunk's first position
    taken: int  # prompt positions whose logits were taken before (a recompute feeds them again)
    params: SamplingParams


@dataclass
class StepSamples:
    """The step's sequences as the sampler sees them, in the step's order: plain data the engine
    fills. Sequence i has the last `num_logits[i]` rows of its new tokens; `inputs[i]` is its
    `SamplerInput` (None: no rows, or a beam's, which its group chooses from); a sequence verifying
    proposals has them in `proposals` (and a client's drafter's distribution in `drafts`)."""

    num_logits: list[int] = field(default_factory=list)
    inputs: list[SamplerInput | None] = field(default_factory=list)
    proposals: dict[int, list[int]] = field(default_factory=dict)
    drafts: dict[int, Draft] = field(default_factory=dict)
    prompts: dict[int, PromptSource] = field(default_factory=dict)  # those keeping prompt logits


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
    def of_step(cls, step: StepSamples, prompt_logits: dict[int, torch.Tensor]) -> SamplingMetadata:
        """The step's metadata. The step's logits hold `step.num_logits[i]` rows per sequence, in
        order; `prompt_logits[i]`: all the rows of the new tokens of sequence i."""
        seqs: list[SeqRows] = []
        rows: list[int] = []
        beams: dict[int, int] = {}
        offset = 0
        for i, (sampled, m) in enumerate(zip(step.inputs, step.num_logits, strict=True)):
            if m and sampled is None:
                beams[i] = offset + m - 1
            elif m:
                seqs.append(_seq_rows(i, sampled, step.proposals.get(i, []), step.drafts.get(i)))
                rows.extend(range(offset, offset + m))
            offset += m
        prompts = [_prompt_rows(i, step.prompts[i], logits) for i, logits in prompt_logits.items()]
        every = rows == list(range(offset))
        return cls(seqs, None if every else rows, beams, [p for p in prompts if p is not None])


def _seq_rows(index: int, sampled: SamplerInput, proposals: list[int], draft: Draft | None) -> SeqRows:
    if not proposals:
        return SeqRows(index, [sampled])
    inputs = [sampled, *(sampled.followed_by(proposals[:j]) for j in range(1, len(proposals) + 1))]
    if draft is None:
        return SeqRows(index, inputs, proposals)
    return SeqRows(index, inputs, proposals, draft.probs, draft.threshold)


def _prompt_rows(index: int, source: PromptSource, logits: torch.Tensor) -> PromptRows | None:
    prompt = source.prompt_ids
    first = source.first  # the chunk's first position
    start = max(source.taken, first)
    rows = logits[start - first : len(prompt) - first]
    if not rows.shape[0]:
        return None
    end = start + rows.shape[0]
    return PromptRows(index, start, rows, tuple(prompt[start + 1 : end + 1]), source.params)
