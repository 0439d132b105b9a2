"""What every OpenAI-style response shares: the `Format` of one request (its envelope, its usage,
the whole response) and the `Stream` that turns (choice index, engine step) pairs into chunks.

The chat and completion shapes are `chat_format.ChatFormat` and `completion_format.CompletionFormat`;
a variant of an API (another vendor's shapes) subclasses them and overrides their hooks.
"""

from __future__ import annotations

import math
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from frontend.engine_client.request import Job
from frontend.engine_client.steps import Generation, Prompt, Step

# The engine's finish reasons in OpenAI's words: stopped by the end token, a stop string or a stop
# token id ("stop"), or by max_tokens / the model's context ("length").
FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "length": "length", "cancelled": "stop"}
MIN_LOGPROB = -9999.0  # JSON has no -inf; what a token with probability 0 reports


def finish_reason(engine_reason: str) -> str | None:
    return FINISH_REASONS.get(engine_reason, engine_reason) if engine_reason else None


def logprob(value: float | None) -> float:
    return MIN_LOGPROB if value is None or not math.isfinite(value) else max(value, MIN_LOGPROB)


# ---------------------------------------------------------------------------------------------
# Usage across choices.


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    batch_size: list[int] = field(default_factory=list)  # per generated token
    queue_wait_us: list[int] = field(default_factory=list)  # per generated token
    prefill_ms: float = 0.0
    decode_ms: list[float] = field(default_factory=list)  # per token after the first

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def usage(jobs: list[Job], choices: list[list[Generation]]) -> Usage:
    """Each prompt counts once; every returned token counts. The per-token timings of several
    sequences follow each other, choice by choice; beams share their steps, so they count once."""
    result = Usage()
    for job, gens in zip(jobs, choices, strict=True):
        if not gens:
            continue
        first = gens[0]
        result.prompt_tokens += first.prompt_tokens or 0
        result.cached_tokens += first.cached_tokens or 0
        if not result.prefill_ms and first.prefill_ms is not None:
            result.prefill_ms = first.prefill_ms
        result.completion_tokens += sum(len(g.tokens) for g in gens)
        for gen in gens[:1] if job.beam_search else gens:
            result.batch_size += gen.batch_sizes
            result.queue_wait_us += gen.queue_wait_us
            result.decode_ms += gen.decode_ms[1:]  # the first token's time is the prefill
    return result


# ---------------------------------------------------------------------------------------------
# One request's format.


class ChoiceStream(Protocol):
    """One choice of a stream: its chunk's `choices` entry per step, and its text so far."""

    text: str  # the text the cumulative (full_text) mode reports for this choice

    def push(self, step: Step) -> dict[str, Any]: ...


@dataclass
class Format(ABC):
    """What every response and chunk of one request repeats, and how its choices look."""

    ID_PREFIX: ClassVar[str]
    OBJECT: ClassVar[str]  # the whole response's `object`
    CHUNK_OBJECT: ClassVar[str]

    model: str
    full_text: bool = False  # cumulative stream text (chat completions' second streaming example)
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.ID_PREFIX}-{uuid.uuid4().hex}"

    def envelope(self, chunk: bool) -> dict[str, Any]:
        obj = self.CHUNK_OBJECT if chunk else self.OBJECT
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage_json(self, u: Usage) -> dict[str, Any]:
        return {
            "prompt_tokens": u.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "batch_size": u.batch_size,
            "queue_wait_time": u.queue_wait_us,  # µs, one entry per generated token
        }

    def extras(self, u: Usage) -> dict[str, Any]:
        """Fields after `usage` in a whole response."""
        return {}

    def lists_prompt(self, job: Job) -> bool:
        """Whether the response lists the prompt's tokens (then `choice` gets them)."""
        return False

    @abstractmethod
    def choice(self, index: int, gen: Generation, job: Job, prompt: Prompt | None) -> dict[str, Any]:
        """One choice of a whole response."""

    @abstractmethod
    def choice_stream(self, index: int, gen: Generation, job: Job, prompt: Prompt | None) -> ChoiceStream:
        """One choice of a stream, adding each step to `gen`."""

    def as_chunk_choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        """A whole response's choice as a stream chunk's (beam search streams one chunk)."""
        return choice

    def response(
        self, jobs: list[Job], choices: list[list[Generation]], prompts: list[Prompt | None]
    ) -> dict[str, Any]:
        body = self.envelope(chunk=False)
        body["choices"] = [
            self.choice(j * job.n + i, gen, job, prompts[j])
            for j, (job, gens) in enumerate(zip(jobs, choices, strict=True))
            for i, gen in enumerate(gens)
        ]
        u = usage(jobs, choices)
        body["usage"] = self.usage_json(u)
        body.update(self.extras(u))
        return body


# ---------------------------------------------------------------------------------------------
# Streams


class Stream:
    """Chunks for (choice index, step) pairs of `jobs`: a `delta` (or `text`) per step, exactly one
    chunk per choice with its `finish_reason`, and usage (and, in the cumulative-text mode,
    `full_text`) on the stream's last chunk. `done` once every choice has finished."""

    def __init__(self, fmt: Format, jobs: list[Job], prompts: list[Prompt | None]) -> None:
        self.format, self.jobs, self.prompts = fmt, jobs, prompts
        self.gens = [[Generation() for _ in range(job.n)] for job in jobs]
        self.choices = [
            fmt.choice_stream(j * job.n + i, gen, job, prompts[j])
            for j, (job, gens) in enumerate(zip(jobs, self.gens, strict=True))
            for i, gen in enumerate(gens)
        ]
        self.unfinished = len(self.choices)

    @property
    def done(self) -> bool:
        return self.unfinished == 0

    @property
    def with_usage(self) -> bool:
        return any(job.stream_usage for job in self.jobs)

    def push(self, index: int, step: Step) -> dict[str, Any]:
        chunk = self.format.envelope(chunk=True)
        choice = self.choices[index]
        chunk["choices"] = [choice.push(step)]
        if step.finish_reason:
            self.unfinished -= 1
            if self.done:
                self._finish(chunk, choice.text)
        return chunk

    def _finish(self, chunk: dict[str, Any], text: str) -> None:
        if self.format.full_text:
            chunk["full_text"] = text  # the last choice's whole text, as its last chunk has it
        if self.with_usage:
            chunk["usage"] = self.format.usage_json(usage(self.jobs, self.gens))

    def whole(self, choices: list[list[Generation]]) -> dict[str, Any]:
        """Beam search streams "fake": one chunk with every finished choice (OpenAI completions)."""
        body = self.format.response(self.jobs, choices, self.prompts)
        chunk = self.format.envelope(chunk=True)
        chunk["choices"] = [self.format.as_chunk_choice(choice) for choice in body["choices"]]
        if self.with_usage:
            chunk["usage"] = body["usage"]
        return chunk
