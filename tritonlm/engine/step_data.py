"""The engine's side of the boundary: the plain data of one scheduled step, filled from the live
Sequences. The worker reads `StepBatch` (what each sequence feeds); the sampler `StepSamples` (what
each sampled row sees). Neither keeps a reference to a Sequence."""

from __future__ import annotations

from tritonlm.engine.scheduler import SchedulerOutput
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.metadata import Draft, PromptSource, StepSamples
from tritonlm.step import EmbedRows, StepBatch


def fed_tokens(seq: Sequence, start: int, end: int) -> list[int]:
    """Tokens [start, end) of what `seq` feeds: prompt + output + this step's proposals."""
    n = seq.num_tokens
    if end <= n:
        return seq.token_slice(start, end)
    return [*seq.token_slice(min(start, n), n), *seq.spec_tokens[max(start - n, 0) : end - n]]


def step_batch(batch: SchedulerOutput) -> StepBatch:
    """What the worker runs of `batch` (before the sequences' `num_computed` advance)."""
    step = StepBatch(copies=batch.copies, state_copies=batch.state_copies)
    pairs = zip(batch.seqs, batch.num_new, batch.num_logits, batch.prompt_logits, strict=True)
    for i, (seq, n, m, keep_all) in enumerate(pairs):
        p, request = seq.num_computed, seq.request
        if n == 1:  # the common case, kept lean
            fed = seq.token_slice(p, p + 1)
        else:
            fed = fed_tokens(seq, p, p + n)
            assert len(fed) == n, f"{n} tokens scheduled, {len(fed)} to feed"
        slot = -1 if seq.state_slot is None else seq.state_slot
        step.add(seq.uid, p, fed, seq.block_table, m, keep_all, request.lora, slot)
        if request.prompt_embeds is not None:
            embeds = request.prompt_embeds
            a, b = embeds.span(p, p + n)
            if a < b:
                step.embeds[i] = EmbedRows([embeds.positions[j] - p for j in range(a, b)], embeds.rows[a:b])
    return step


def step_samples(batch: SchedulerOutput, step: StepBatch) -> StepSamples:
    """What the sampler sees of `batch`, whose worker's data is `step` (before the sequences'
    `num_computed` advance)."""
    samples = StepSamples(step.num_logits)
    inputs = samples.inputs
    for i, (seq, m) in enumerate(zip(batch.seqs, step.num_logits, strict=True)):
        if not m or seq.group is not None:  # no rows, or a beam: its group chooses
            inputs.append(None)
        else:
            inputs.append(seq.sampler_input())
            if m > 1:
                samples.proposals[i] = proposals = seq.spec_tokens[: m - 1]
                draft = seq.request.draft if not seq.output_ids else None  # a client's: the first step
                if draft is not None:
                    probs = draft.probs[: len(proposals)] if draft.probs is not None else None
                    samples.drafts[i] = Draft(probs, draft.threshold)
        if step.prompt_logits[i]:
            samples.prompts[i] = PromptSource(
                seq.prompt_ids, seq.num_computed, seq.out.prompt_positions, seq.params
            )
    return samples
