"""Runs a Job on the engine (`EngineClient`) and reads its streamed responses as `Step`s: the new
text, the tokens, and the finish reason.

API-neutral: every route shapes these into its own JSON; `steps` is the one generation path.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from frontend.engine_client.client import EngineClient
from frontend.engine_client.request import Job
from frontend.engine_client.triton import Triton
from frontend.errors import APIError
from frontend.ops.context import SequenceTracker

T = TypeVar("T")


@dataclass
class TopToken:
    id: int
    text: str
    logprob: float | None


@dataclass
class Token:
    id: int
    text: str  # this token's text decoded alone
    logprob: float | None
    special: bool
    top: list[TopToken] = field(default_factory=list)  # the best alternatives, when requested


@dataclass
class Step:
    """One engine response for one sequence (one beam of it)."""

    text: str  # new text of this response; "" while postprocessing holds text back
    tokens: list[Token]
    finish_reason: str  # "" until the final response, then one of contract.FINISH_REASONS
    prompt_tokens: int | None
    cached_tokens: int | None = None
    prefill_ms: float | None = None
    # Per engine step of this response: running sequences, µs waited before it, ms since the last.
    batch_sizes: list[int] = field(default_factory=list)
    queue_wait_us: list[int] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)
    cum_log_prob: float | None = None  # of the whole sequence so far, when log probs are on
    stop_reason: str = ""  # the stop string that ended the text (final response)
    # Prompt log probs (first response, when requested): None for the first token.
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top: list[list[TopToken]] = field(default_factory=list)


@dataclass
class Generation:
    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    prefill_ms: float | None = None
    batch_sizes: list[int] = field(default_factory=list)
    queue_wait_us: list[int] = field(default_factory=list)
    decode_ms: list[float] = field(default_factory=list)
    cum_log_prob: float | None = None
    stop_reason: str = ""
    prompt_logprobs: list[float | None] = field(default_factory=list)
    prompt_top: list[list[TopToken]] = field(default_factory=list)

    def add(self, step: Step) -> None:
        self.text += step.text
        self.tokens.extend(step.tokens)
        self.finish_reason = step.finish_reason or self.finish_reason
        self.prompt_tokens = step.prompt_tokens if step.prompt_tokens is not None else self.prompt_tokens
        if self.cached_tokens is None:
            self.cached_tokens = step.cached_tokens
        if self.prefill_ms is None:
            self.prefill_ms = step.prefill_ms
        self.batch_sizes += step.batch_sizes
        self.queue_wait_us += step.queue_wait_us
        self.decode_ms += step.decode_ms
        if step.cum_log_prob is not None:
            self.cum_log_prob = step.cum_log_prob
        self.stop_reason = step.stop_reason or self.stop_reason
        if step.prompt_logprobs:
            self.prompt_logprobs, self.prompt_top = step.prompt_logprobs, step.prompt_top


def _strings(array: np.ndarray | None) -> list[str]:
    if array is None:
        return []
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def _finite(value: float) -> float | None:
    # JSON has no -inf/NaN; a logprob that is not a number is reported as unknown.
    return float(value) if math.isfinite(value) else None


def _first(array: np.ndarray | None, kind: type = int) -> object | None:
    return kind(array.reshape(-1)[0]) if array is not None and array.size else None


def _top(
    ids: np.ndarray | None, values: np.ndarray | None, texts: np.ndarray | None, row: int
) -> list[TopToken]:
    """Row `row` of [rows, k] alternatives; entries with id -1 are padding."""
    if ids is None or values is None or ids.ndim != 2 or row >= ids.shape[0]:
        return []
    names = texts if texts is not None and texts.shape == ids.shape else None
    return [
        TopToken(
            int(i),
            (names[row, j].decode("utf-8", "replace") if names is not None else ""),
            _finite(float(values[row, j])),
        )
        for j, i in enumerate(ids[row])
        if i >= 0
    ]


# The engine outputs `parse_step` reads: always, and with log probs (or token details) on.
STEP_OUTPUTS = (
    "text_output",
    "output_ids",
    "sequence_length",
    "finish_reason",
    "stop_reason",
    "prompt_tokens",
    "cached_tokens",
    "prefill_ms",
    "batch_size",
    "queue_wait_us",
    "decode_ms",
)
LOGPROB_OUTPUTS = (
    "token_texts",
    "output_log_probs",
    "cum_log_probs",
    "top_ids",
    "top_log_probs",
    "top_token_texts",
    "prompt_log_probs",
    "prompt_top_ids",
    "prompt_top_log_probs",
    "prompt_top_token_texts",
)


def step_outputs(with_logprobs: bool, token_special: bool = False) -> tuple[str, ...]:
    """What to ask Triton for: every output costs a copy per response, on every hop.
    `token_special`: whether each token is special (TGI's stream events say)."""
    outputs = STEP_OUTPUTS + LOGPROB_OUTPUTS if with_logprobs else STEP_OUTPUTS
    return (*outputs, "token_special") if token_special else outputs


def beam_count(outputs: dict[str, np.ndarray]) -> int:
    ids = outputs.get("output_ids")
    return 1 if ids is None or ids.ndim < 2 else max(1, ids.shape[0])


def parse_step(outputs: dict[str, np.ndarray], with_logprobs: bool, beam: int = 0) -> Step:
    """The response's tokens and text for one beam (`output_ids` [beam, n]: beam b's row, cut to
    `sequence_length[b]`; token texts are laid out beam after beam)."""
    raw_ids = outputs.get("output_ids", np.zeros((1, 0), np.int32))
    rows = raw_ids.reshape(1, -1) if raw_ids.ndim < 2 else raw_ids.reshape(raw_ids.shape[0], -1)
    lengths = outputs.get("sequence_length")
    lengths = lengths.reshape(-1).tolist() if lengths is not None and lengths.size == rows.shape[0] else None
    if lengths is None:
        lengths = [rows.shape[1]] * rows.shape[0]
    ids = [int(i) for i in rows[beam, : lengths[beam]]]
    n, offset = len(ids), sum(lengths[:beam])
    texts = _strings(outputs.get("token_texts"))[offset : offset + n]
    special = [bool(s) for s in outputs.get("token_special", np.zeros(0, np.bool_)).reshape(-1)]
    special = special[offset : offset + n]
    # Log probs are zeros (or absent) unless requested; report them only when they are real.
    raw = outputs.get("output_log_probs")
    logprobs: list[float | None] = []
    if with_logprobs and raw is not None and raw.size:
        per_beam = raw.reshape(rows.shape[0], -1) if raw.size % rows.shape[0] == 0 else raw.reshape(1, -1)
        logprobs = [_finite(v) for v in per_beam[min(beam, per_beam.shape[0] - 1)][:n]]
    top_ids, top_values = outputs.get("top_ids"), outputs.get("top_log_probs")
    top_texts = outputs.get("top_token_texts")
    # Alternatives are per token of a single sequence, or per token of every beam, beam after beam.
    top_base = offset if top_ids is not None and top_ids.ndim == 2 and top_ids.shape[0] > n else 0
    if beam and not top_base:
        top_ids = None
    tokens = [
        Token(
            id=ids[i],
            text=texts[i] if i < len(texts) else "",
            logprob=logprobs[i] if i < len(logprobs) else None,
            special=special[i] if i < len(special) else False,
            top=_top(top_ids, top_values, top_texts, top_base + i) if with_logprobs else [],
        )
        for i in range(n)
    ]
    reason = _strings(outputs.get("finish_reason"))
    stop = _strings(outputs.get("stop_reason"))
    cum = outputs.get("cum_log_probs")
    cum_values = cum.reshape(-1).tolist() if cum is not None and cum.size else []
    prompt_lp = outputs.get("prompt_log_probs")
    prompt_logprobs: list[float | None] = []
    prompt_top: list[list[TopToken]] = []
    if with_logprobs and prompt_lp is not None and prompt_lp.size:
        prompt_logprobs = [None] + [_finite(float(v)) for v in prompt_lp.reshape(-1)[1:]]
        pids, pvalues = outputs.get("prompt_top_ids"), outputs.get("prompt_top_log_probs")
        ptexts = outputs.get("prompt_top_token_texts")
        prompt_top = [_top(pids, pvalues, ptexts, row) for row in range(len(prompt_logprobs))]
    texts_out = _strings(outputs.get("text_output"))
    return Step(
        text=texts_out[beam] if beam < len(texts_out) else "",
        tokens=tokens,
        finish_reason=reason[min(beam, len(reason) - 1)] if reason else "",
        prompt_tokens=_first(outputs.get("prompt_tokens")),
        cached_tokens=_first(outputs.get("cached_tokens")),
        prefill_ms=_first(outputs.get("prefill_ms"), float),
        batch_sizes=[int(v) for v in outputs.get("batch_size", np.zeros(0)).reshape(-1)],
        queue_wait_us=[int(v) for v in outputs.get("queue_wait_us", np.zeros(0)).reshape(-1)],
        decode_ms=[float(v) for v in outputs.get("decode_ms", np.zeros(0)).reshape(-1)],
        cum_log_prob=cum_values[beam] if beam < len(cum_values) else None,
        stop_reason=stop[beam] if beam < len(stop) else "",
        prompt_logprobs=prompt_logprobs,
        prompt_top=prompt_top,
    )


async def steps(triton: Triton, job: Job, index: int = 0) -> AsyncGenerator[Step, None]:
    """Sequence `index` of `job`, step by step; a model's error is renamed into the job's API."""
    # aclosing: closing this generator must close Triton's stream now (which cancels the request),
    # not whenever the garbage collector gets to it.
    outputs = step_outputs(job.with_logprobs, job.token_special)
    upstream = EngineClient(triton, job.served).stream(job, index, outputs)
    tracker = SequenceTracker(counts_prompt=index == 0)  # token counts and timings for logs, metrics
    async with contextlib.aclosing(upstream) as responses:
        try:
            async for outputs in responses:
                step = parse_step(outputs, job.with_logprobs)
                tracker.step(step.prompt_tokens, len(step.tokens))
                yield step
        except APIError as error:
            raise job.named(error) from None


async def generate(triton: Triton, job: Job, index: int = 0) -> Generation:
    return await collect(steps(triton, job, index))


async def first(upstream: AsyncIterator[T]) -> T:
    """The first item of a stream, awaited before a streaming answer's headers go out, so that an
    error the models report for the request still gets its HTTP status."""
    async for item in upstream:
        return item
    raise APIError(500, "inference failed: Triton returned no response")


def unfinished() -> APIError:
    """A generation whose stream ended before a finish reason (a server fault, never the client's)."""
    return APIError(500, "inference failed: the generation ended without a finish reason")


async def collect(step_stream: AsyncIterator[Step]) -> Generation:
    """Every step of one sequence into a Generation (closing the stream however it ends)."""
    result = Generation()
    async with contextlib.aclosing(step_stream) as stream:
        async for step in stream:
            result.add(step)
    if not result.finish_reason:
        raise unfinished()
    return result


@dataclass
class Prompt:
    """The prompt's tokens, for `echo` with logprobs (the frontend has no tokenizer)."""

    ids: list[int]
    texts: list[str]


async def prompt_tokens(triton: Triton, job: Job) -> Prompt:
    try:
        out = await EngineClient(triton, job.served).prompt(job)
    except APIError as error:
        raise job.named(error) from None
    texts = out.get("input_token_texts", np.array([], dtype=object)).reshape(-1)
    return Prompt(
        ids=[int(i) for i in out["input_ids"].reshape(-1)],
        texts=[t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in texts],
    )
