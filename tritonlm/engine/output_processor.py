"""Stage 4 of a step: what the sampler chose becomes the sequences' outputs.

`OutputProcessor.update` advances what each sequence has computed, keeps the prompt logits and
prompt log probs the sampler took, appends each sequence's tokens one by one with their timings,
log probs and text, checks the stop rules (engine.stopping) after each, settles the proposals the
step fed (rejected ones give their slots back), hands beams' logits to their group (which advances
them through the scheduler) and reports through `on_output`: a sequence and the number of tokens
it gained (0 when it finished without a new token), on the loop thread. Whoever receives it must
not block (Triton's adapter hands it to a sender thread).
"""

from __future__ import annotations

from collections.abc import Callable

from tritonlm.engine.beam_group import BeamGroup
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler, SchedulerOutput
from tritonlm.engine.sequence import Sequence, Status, TokenTiming
from tritonlm.engine.speculator import Speculator
from tritonlm.engine.stats import EngineStats
from tritonlm.engine.stopping import finish_reason
from tritonlm.errors import CLIENT_ERROR_MARKER
from tritonlm.sampling.sampler import PromptLogProbs, SampledTokens, Sampler, SamplerOutput

OutputCallback = Callable[[Sequence, int], None]

GRAMMAR_DEAD_END = (
    f"{CLIENT_ERROR_MARKER} guided_decoding_guide: the grammar allows no token that the other "
    "settings (min_length, bad_words) allow"
)


class OutputProcessor:
    def __init__(
        self,
        scheduler: Scheduler,
        blocks: BlockManager,
        sampler: Sampler,
        stats: EngineStats,
        on_output: OutputCallback,
        max_seq_len: int,
        speculator: Speculator | None = None,
    ):
        self.scheduler = scheduler
        self.blocks = blocks
        self.sampler = sampler  # its processors also process beam search's log probs
        self.stats = stats
        self.on_output = on_output
        self.max_seq_len = max_seq_len
        self.speculator = speculator

    def update(self, batch: SchedulerOutput, sampled: SamplerOutput, start: float, end: float) -> None:
        """A step fed `batch` between `start` and `end` (perf_counter seconds) and chose `sampled`."""
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new, strict=True)):
            seq.num_computed += n
            if i in sampled.prompts:
                _keep_prompt(seq, sampled.prompts[i])
            if not seq.made_tokens and n:
                seq.out.prefill_ms += (end - start) * 1e3  # every step that fed its prompt
        for i, made in sampled.tokens.items():
            self._append(batch.seqs[i], made, len(batch), start, end)
        for i, logits in sampled.beam_logits.items():
            group = batch.seqs[i].group
            if group is not None and group.report(batch.seqs[i], logits):
                self._advance_beams(group, len(batch), start, end)

    # -- finishing --------------------------------------------------------------------------------
    def retire(self, seq: Sequence, reason: str, new_tokens: int = 0) -> None:
        """Reports a finished sequence; the caller already took it out of the scheduler."""
        if seq.text is not None:
            seq.out.text_end = seq.text.finish()
        if self.speculator is not None:
            self.speculator.forget(seq)
        seq.out.finish_reason = reason
        if reason != "cancelled":
            self.stats.finished(seq.out.timings)
        self.on_output(seq, new_tokens)

    def fail(self, seq: Sequence, message: str) -> None:
        """Ends a request with an error; it is out of the scheduler already (`finish`), or was
        never in it."""
        seq.status = Status.FINISHED
        seq.out.error = message
        self.retire(seq, "error")

    def finish(self, seq: Sequence) -> None:
        """Takes a request out of the scheduler: a beam-search request with all its beams."""
        if seq.group is not None:
            seq.group.finish(self.scheduler)
            seq.status = Status.FINISHED
        else:
            self.scheduler.finish(seq)

    def drop_cancelled(self) -> None:
        for seq in [s for s in self.scheduler.sequences() if s.is_cancelled()]:
            request = request_of(seq)
            if not request.finished:  # another beam of its group may have retired it already
                self.finish(request)
                self.retire(request, "cancelled")

    # -- appending --------------------------------------------------------------------------------
    def _append(self, seq: Sequence, made: SampledTokens, batch_size: int, start: float, end: float) -> None:
        """Appends a step's tokens one by one, each checked against the stop rules (a stop ends
        the run: later tokens are dropped), settles the proposals the step fed, and reports the run
        once: one response per accepted run of tokens. Timings stay per token: the first carries
        the wait and the step's time, the others arrived with it."""
        out = seq.out
        if not seq.made_tokens:
            self.stats.first_token(end - seq.request.arrival)
            out.first_token_at = end
        out.drafts_proposed += made.proposed
        out.drafts_accepted += len(made.tokens) - 1 if made.proposed else 0
        tokens, reason = made.tokens, ""
        for j, token in enumerate(tokens):
            first = j == 0
            out.timings.append(
                TokenTiming(
                    batch_size,
                    int((start - seq.last_event) * 1e6) if first else 0,
                    (end - seq.last_event) * 1e3 if first else 0.0,
                )
            )
            seq.output_ids.append(token)
            self.stats.generated(1)
            if seq.grammar is not None and not seq.grammar.sync(seq.output_ids):
                # Only when other rules banned every token the grammar allows (min_length, bad_words).
                self.scheduler.finish(seq)
                out.error = GRAMMAR_DEAD_END
                self.retire(seq, "error", new_tokens=j + 1)
                return
            _append_extras(seq, made, j)
            reason = finish_reason(seq, self.max_seq_len)
            if reason:
                tokens = tokens[: j + 1]
                break
        seq.last_event = end
        if reason:
            self.scheduler.finish(seq)
            self.retire(seq, reason, new_tokens=len(tokens))
            return
        if made.proposed or seq.spec_tokens:  # rejected proposals give their slots back
            self.blocks.rollback(seq, made.proposed - (len(tokens) - 1))
        self.on_output(seq, len(tokens))

    def _advance_beams(self, group: BeamGroup, batch_size: int, start: float, end: float) -> None:
        head = group.head
        if not head.out.timings:
            self.stats.first_token(end - head.request.arrival)
        self.stats.generated(len(group.beams))
        if group.advance(self.scheduler, self.sampler.processors, batch_size, start, end):
            reasons = group.finish_reasons()
            head.status = Status.FINISHED
            self.retire(head, reasons[0] if reasons else "length")


def request_of(seq: Sequence) -> Sequence:
    """The sequence a client's responses come from: a beam's group head, else itself."""
    return seq.group.head if seq.group is not None else seq


def _append_extras(seq: Sequence, made: SampledTokens, j: int) -> None:
    """What the j-th token of a step brings besides itself: its logits, log prob, text."""
    out = seq.out
    if made.generation_logits is not None:
        out.generation_logits.append(made.generation_logits[j])
    if made.log_probs is not None:
        out.log_probs.append(made.log_probs[j])
        if made.top_ids is not None and made.top_log_probs is not None:
            out.top_ids.append(made.top_ids[j])
            out.top_log_probs.append(made.top_log_probs[j])
    if seq.text is not None:
        out.texts.append(seq.text.add([seq.output_ids[-1]]))


def _keep_prompt(seq: Sequence, chunk: PromptLogProbs) -> None:
    out = seq.out
    out.prompt_positions = chunk.start + chunk.positions
    if chunk.logits is not None:
        out.prompt_logits.append(chunk.logits)
    out.prompt_log_probs.extend(chunk.chosen)
    out.prompt_top_ids.extend(chunk.top_ids)
    out.prompt_top_log_probs.extend(chunk.top_log_probs)
