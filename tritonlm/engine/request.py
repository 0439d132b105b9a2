"""What a client asked for, as the engine keeps it: immutable once parsed (`serving.engine_inputs`
builds it from the request tensors). Everything that changes while it runs is a `Sequence`'s."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from tritonlm.sampling.params import SamplingParams

_keys = itertools.count(1)


@dataclass(frozen=True, eq=False)
class Request:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    params: SamplingParams
    streaming: bool = False  # one response per step that made tokens, else one at the end
    stop_words: tuple[tuple[int, ...], ...] = ()  # token sequences that end the generation
    stop_strings: tuple[str, ...] = ()  # texts that end the generation
    beam_width: int = 1  # > 1: a beam search (engine.beam_group)
    len_penalty: float = 1.0
    early_stopping: int = 1
    # The text outputs: whether the client asked the engine for them, and how they are made.
    text_wanted: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    key: int = field(default_factory=lambda: next(_keys))  # unique per request
    arrival: float = field(default_factory=time.perf_counter)

    @property
    def needs_prompt_logits(self) -> bool:
        """The logits of every prompt position are wanted (so no prefix-cache reuse)."""
        return self.params.return_context_logits or self.params.return_prompt_log_probs
