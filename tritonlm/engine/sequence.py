"""A request while the engine runs it: its tokens, its place in the KV cache, its status, and the
outputs its responses report.

A `Sequence` is owned by the engine loop thread. Its `request` never changes; `output_ids` and the
lists of its `out` only grow, so the sender thread may read a range the loop reported while the loop
goes on appending.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from tritonlm.engine.request import Request
from tritonlm.sampling.params import SamplerInput, SamplingParams
from tritonlm.structured_output import GrammarState
from tritonlm.text.stream import TextStream, stop_texts

if TYPE_CHECKING:
    from tritonlm.sampling.beam_search import Beam
    from tritonlm.sampling.logits_processors.base import LogitsPipeline


_uids = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"  # queued for admission (new, or preempted: then recomputed), no KV blocks
    RUNNING = "running"  # admitted: holds KV blocks and is scheduled every step it has tokens to feed
    AWAITING_BEAMS = "awaiting beams"  # a beam that reported its logits; steps when its group does
    FINISHED = "finished"  # out of the scheduler, blocks freed


class BeamGroup(Protocol):
    """A beam-search request's group as the engine reaches it through `Sequence.group`: the
    interface of engine.beam_group.BeamGroup, declared here because that module builds Sequences
    (so the two never import each other). `scheduler` is the engine's Scheduler."""

    head: Sequence
    beams: list[Sequence]
    results: list[Beam]

    def report(self, beam: Sequence, logits: torch.Tensor) -> bool: ...

    def advance(
        self, scheduler: Any, processors: LogitsPipeline, batch_size: int, start: float, end: float
    ) -> bool: ...

    def finish(self, scheduler: Any) -> None: ...

    def finish_reasons(self) -> list[str]: ...


@dataclass
class TokenTiming:
    batch_size: int  # sequences in the step that produced the token
    queue_wait_us: int  # time the sequence waited for that step (admission or scheduling gaps)
    decode_ms: float  # wall time since the previous token (or since admission for the first)


@dataclass
class Outputs:
    """What the responses report, besides the tokens."""

    log_probs: list[float] = field(default_factory=list)  # of each generated token
    # Per generated token, with num_top_log_probs: the best alternatives (ids, log probs), best first.
    top_ids: list[list[int]] = field(default_factory=list)
    top_log_probs: list[list[float]] = field(default_factory=list)
    timings: list[TokenTiming] = field(default_factory=list)
    # With return_context_logits: the logits of every prompt position, float32 on the CPU, one
    # tensor [positions, vocab] per prefill chunk. With return_generation_logits: the logits row
    # [vocab] each generated token was sampled from.
    prompt_logits: list[torch.Tensor] = field(default_factory=list)
    prompt_positions: int = 0  # prompt positions whose logits were taken (a recompute feeds them again)
    # With return_prompt_log_probs: of prompt tokens 1.. under the positions before them (the
    # sampler's, after temperature), and with num_top_log_probs their best alternatives.
    prompt_log_probs: list[float] = field(default_factory=list)
    prompt_top_ids: list[list[int]] = field(default_factory=list)
    prompt_top_log_probs: list[list[float]] = field(default_factory=list)
    generation_logits: list[torch.Tensor] = field(default_factory=list)
    # With a text stream (Sequence.text): the text each generated token released, and what the
    # stream still held when the sequence finished.
    texts: list[str] = field(default_factory=list)
    text_end: str = ""
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied at the first admission
    prefill_ms: float = 0.0  # the steps that fed the prompt, together
    # perf_counter seconds: the first admission, the end of the step that made the first token.
    scheduled_at: float = 0.0
    first_token_at: float = 0.0
    drafts_proposed: int = 0  # proposals verified for it (speculative decoding, draft tokens)
    drafts_accepted: int = 0
    finish_reason: str = ""  # "" while running; else one of contract.FINISH_REASONS, or "error"
    error: str = ""  # with finish_reason "error": the request fails with this message


@dataclass(eq=False)  # compared by identity: two sequences are never "equal"
class Sequence:
    request: Request
    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    out: Outputs = field(default_factory=Outputs)
    # KV cache (engine.block_manager): the blocks holding this sequence's keys/values, in order; how
    # many of its tokens (prompt, then output) are in them; the prefix-cache keys of its full blocks.
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_hashes: list[int] = field(default_factory=list)
    # Its recurrent-state slot while it runs, for a model with recurrent layers (None: none held).
    state_slot: int | None = None
    num_preemptions: int = 0
    # Proposed tokens (e.g. draft tokens to verify) that follow prompt + output for one step: a
    # decoding sequence then feeds its pending token and these together. They are never part of the
    # prefix cache's keys; whoever sets them settles them after the step (BlockManager.rollback),
    # and a preemption drops them. Only for a decoding sequence (one pending token).
    spec_tokens: list[int] = field(default_factory=list)
    random_key: int | None = None  # a sampling request's draws derive from it (sampling.draws)
    # Structured output: the grammar its output must match (structured_output.GrammarState).
    # Constrained sequences take no proposals (spec_tokens): the mask covers one token per step.
    grammar: GrammarState | None = None
    group: BeamGroup | None = None  # of a beam-search request and of each of its beams
    is_cancelled: Callable[[], bool] = lambda: False  # set by the Triton adapter
    # Its text, made once on the loop thread (stop strings, text_output); None when nobody asked
    # for text or stop strings.
    text: TextStream | None = None
    last_event: float = 0.0  # end of the step that produced the previous token (or arrival)
    uid: int = field(default_factory=_uids.__next__)  # names it to the worker (StepBatch.seq_ids)

    def __post_init__(self) -> None:
        self.last_event = self.last_event or self.request.arrival

    @classmethod
    def start(
        cls,
        request: Request,
        *,
        max_seq_len: int,
        tokenizer: Any = None,
        grammar: GrammarState | None = None,
        is_cancelled: Callable[[], bool] | None = None,
    ) -> Sequence:
        """A request's sequence, whole: its random key, its text stream (with a `tokenizer`), its
        grammar, a client's draft tokens as its first proposals (verified with the prompt's last
        chunk; never past the limits), and a resumed stream's output so far."""
        spec_tokens: list[int] = []
        if request.draft is not None:
            room = request.new_token_room(max_seq_len) - 1
            spec_tokens = list(request.draft.ids[: max(room, 0)])
        seq = cls(
            request,
            spec_tokens=spec_tokens,
            random_key=request.params.random_key(),
            grammar=grammar,
            is_cancelled=is_cancelled or (lambda: False),
            text=text_stream(request, tokenizer),
        )
        seq.carry_resumed()
        return seq

    def carry_resumed(self) -> None:
        """A resumed stream's tokens already sent start the output, as if this engine had made them:
        they count for the limits, penalties, the grammar and the stop rules, and the text stream
        reads them one by one as the first replica's did, so its state (a character split across
        tokens, text held back for a stop string) continues exactly. Their per-token outputs are
        placeholders: responses report tokens from the first new one on."""
        params, out = self.params, self.out
        for token in self.request.resumed_ids:
            self.output_ids.append(token)
            out.timings.append(TokenTiming(0, 0, 0.0))
            if params.return_log_probs:
                out.log_probs.append(0.0)  # cum_log_probs then sums the new tokens only
            if params.num_top_log_probs:
                out.top_ids.append([])
                out.top_log_probs.append([])
            if params.return_generation_logits:
                out.generation_logits.append(torch.zeros(0))
            if self.text is not None:
                self.text.add([token])  # sent already
                out.texts.append("")

    # -- the request's, for short -----------------------------------------------------------------
    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def key(self) -> int:
        return self.request.key

    @property
    def needs_prompt_logits(self) -> bool:
        return self.request.needs_prompt_logits

    # -- tokens -----------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_ids) + len(self.output_ids)

    @property
    def made_tokens(self) -> int:
        """Output tokens this engine made (a resumed stream's earlier ones aside)."""
        return len(self.output_ids) - len(self.request.resumed_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without concatenating the whole lists."""
        prompt = self.request.prompt_ids
        n = len(prompt)
        if end <= n:
            return list(prompt[start:end])
        if start >= n:
            return self.output_ids[start - n : end - n]
        return [*prompt[start:], *self.output_ids[: end - n]]

    def sampler_input(self) -> SamplerInput:
        """What the sampler sees (a verification row: `SamplerInput.followed_by`)."""
        return SamplerInput(
            self.params, self.request.prompt_ids, self.output_ids, self.random_key, self.grammar
        )


def text_stream(request: Request, tokenizer: Any) -> TextStream | None:
    """A sequence's text stream, when it needs one: it has stop strings (or stop words, also looked
    for as text) or its client wants text. Beam search makes its texts at the end instead."""
    if tokenizer is None or request.beam_width > 1:
        return None
    stops = stop_texts(tokenizer, request.stop_strings, request.stop_words)
    if not stops and not request.text_wanted:
        return None
    return TextStream(
        tokenizer,
        request.skip_special_tokens,
        stops,
        request.include_stop_str_in_output,
        armed_at=request.params.min_length,  # stop words count from min_length on
    )
