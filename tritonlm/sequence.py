"""One generation request as the engine tracks it: tokens, limits, stop rules, timings."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tritonlm.sampling import SamplerInput, SamplingParams

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

    output_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    timings: list[TokenTiming] = field(default_factory=list)
    finish_reason: str = ""  # "" while running; else one of contract.FINISH_REASONS
    slot: int = -1
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
    def num_cached(self) -> int:
        """Tokens whose keys/values are in the cache: all but the newest, none before the prefill."""
        return len(self.prompt_ids) + len(self.output_ids) - 1 if self.output_ids else 0

    @property
    def pending_ids(self) -> list[int]:
        """Tokens to feed in the next forward step."""
        return self.output_ids[-1:] if self.output_ids else self.prompt_ids

    def sampler_input(self) -> SamplerInput:
        return SamplerInput(self.params, self.prompt_ids, self.output_ids, self.generator)

    def check_stop(self, new_text: str, max_seq_len: int) -> str:
        """The finish reason after appending the newest token, or "" to go on."""
        token = self.output_ids[-1]
        if token == self.params.end_id:  # the sampler bans end_id before min_length
            return "end_id"
        for word in self.stop_words:
            if self.output_ids[-len(word) :] == word:
                return "stop_words"
        if self.stop_strings and new_text:
            # A stop string may straddle tokens: search the tail that could still contain a new match.
            longest = max(len(s) for s in self.stop_strings)
            self.text_tail = (self.text_tail + new_text)[-(longest + len(new_text)) :]
            if any(s in self.text_tail for s in self.stop_strings):
                return "stop_words"
        if (
            len(self.output_ids) >= self.max_new_tokens
            or len(self.prompt_ids) + len(self.output_ids) >= max_seq_len
        ):
            return "length"
        return ""
