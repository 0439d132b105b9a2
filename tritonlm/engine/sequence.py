"""One generation request as the engine tracks it: tokens, limits, stop rules, timings."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tritonlm.sampling.sampler import SamplerInput, SamplingParams

_keys = itertools.count(1)


@dataclass
class TokenTiming:
    batch_size: int  # sequences in the step that produced the token
    queue_wait_us: int  # time the sequence waited for that step (admission or scheduling gaps)
    decode_ms: float  # wall time since the previous token (or since admission for the first)


@dataclass
class Sequence:
    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    streaming: bool = False
    stop_words: list[list[int]] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    is_cancelled: Callable[[], bool] = lambda: False
    key: int = field(default_factory=lambda: next(_keys))
    beam_width: int = 1  # > 1: the engine runs a beam search (tritonlm.sampling.beam_search) for it
    len_penalty: float = 1.0
    early_stopping: int = 1
    group: object | None = None  # the BeamGroup of a beam-search request's beams (engine-owned)
    # Detokenization settings, only echoed to postprocessing.
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    output_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    # Per generated token, with num_top_log_probs: the best alternatives (ids, log probs), best first.
    top_ids: list[list[int]] = field(default_factory=list)
    top_log_probs: list[list[float]] = field(default_factory=list)
    timings: list[TokenTiming] = field(default_factory=list)
    finish_reason: str = ""  # "" while running; else one of contract.FINISH_REASONS
    # KV cache (tritonlm.engine.block_manager): the blocks holding this sequence's keys/values, in order;
    # how many of its tokens (prompt, then output) are in them; the prefix-cache keys of its full
    # blocks; and the prompt tokens the prefix cache supplied at its first admission.
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_hashes: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    num_preemptions: int = 0
    # With params.return_context_logits: logits of every prompt position, float32 on the CPU, one
    # tensor [positions, vocab] per prefill chunk. With params.return_generation_logits: the raw
    # logits row [vocab] each generated token was sampled from.
    prompt_logits: list[torch.Tensor] = field(default_factory=list)
    generation_logits: list[torch.Tensor] = field(default_factory=list)
    generator: torch.Generator | None = None
    text_tail: str = ""  # recent decoded text, kept only to match stop strings across tokens
    detokenizer: object | None = None
    error: str = ""  # set with finish_reason "error": the request fails with this message

    arrival: float = field(default_factory=time.perf_counter)
    last_event: float = 0.0  # end of the step that produced the previous token (or arrival)
    prefill_ms: float = 0.0

    def __post_init__(self) -> None:
        self.last_event = self.arrival

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without concatenating the lists."""
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def needs_prompt_logits(self) -> bool:
        """The logits of every prompt position are wanted (so no prefix-cache reuse)."""
        return self.params.return_context_logits or self.params.return_prompt_log_probs

    def sampler_input(self) -> SamplerInput:
        return SamplerInput(self.params, self.prompt_ids, self.output_ids, self.generator)

    def check_stop(self, new_text: str, max_seq_len: int) -> str:
        """The finish reason after appending the newest token, or "" to go on."""
        token = self.output_ids[-1]
        if token == self.params.end_id:  # the sampler bans end_id before min_length
            return "end_id"
        if len(self.output_ids) < self.params.min_length:  # stop words count from min_length on
            return self._length_reason(max_seq_len)
        for word in self.stop_words:
            if self.output_ids[-len(word) :] == word:
                return "stop_words"
        if self.stop_strings and new_text:
            # A stop string may straddle tokens: search the tail that could still contain a new match.
            longest = max(len(s) for s in self.stop_strings)
            self.text_tail = (self.text_tail + new_text)[-(longest + len(new_text)) :]
            if any(s in self.text_tail for s in self.stop_strings):
                return "stop_words"
        return self._length_reason(max_seq_len)

    def _length_reason(self, max_seq_len: int) -> str:
        total = len(self.prompt_ids) + len(self.output_ids)
        return "length" if len(self.output_ids) >= self.max_new_tokens or total >= max_seq_len else ""
