"""Generation jobs of the OpenAI-style APIs, API-neutral: what to generate, how many sequences, and
running them on the Triton ensemble.

A `Job` is one prompt (text or chat messages) with its sampling settings. `n`/`best_of` fan out into
`best_of` Triton requests with the same prompt (the engine's prefix cache shares their prefill; a
given seed becomes seed + i, so each stays reproducible); with best_of > n the n with the highest
cumulative log probability are returned. Beam search is one Triton request with `beam_width`, whose
final response holds every beam.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from frontend.engine_client.steps import (
    Generation,
    Step,
    Token,
    Triton,
    beam_count,
    collect,
    parse_step,
    step_outputs,
)
from frontend.engine_client.triton import ENSEMBLE, PREPROCESSING, tensors
from frontend.errors import APIError

_SEED_SPACE = 2**64


@dataclass
class Job:
    prompt: str | None = None  # the text prompt, or:
    messages: list[dict[str, Any]] | None = None  # a conversation for the chat template
    chat_template_kwargs: dict[str, Any] | None = None
    max_tokens: int | None = None  # None: as many as fit in the context
    min_tokens: int = 0
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: no limit
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False
    n: int = 1
    best_of: int = 1  # sequences generated; the n best are returned
    beam_search: bool = False  # then best_of is the beam width
    logprobs: int | None = None  # alternatives per token (0: the chosen token only); None: off
    echo: bool = False  # the prompt is part of the returned text (and of logprobs)
    suffix: str = ""  # appended to each returned text (Databricks)
    truncate_to_fit: bool = False  # Databricks' error_behavior "truncate"
    stream: bool = False
    stream_usage: bool = True  # usage on the last chunk of a stream
    prompt_param: str = "prompt"  # the API's names, for errors the models report
    max_tokens_param: str = "max_tokens"

    @property
    def ranked(self) -> bool:
        return not self.beam_search and self.best_of > self.n

    @property
    def with_logprobs(self) -> bool:
        """Whether the engine must compute log probs (reported, or needed to rank)."""
        return self.logprobs is not None or self.ranked

    def prompt_inputs(self) -> dict[str, Any]:
        """The inputs that decide the prompt's tokens (for the ensemble and for preprocessing)."""
        values: dict[str, Any] = {}
        if self.messages is not None:
            values["chat_messages"] = json.dumps(self.messages, ensure_ascii=False)
            if self.chat_template_kwargs:
                values["chat_template_kwargs"] = json.dumps(self.chat_template_kwargs, ensure_ascii=False)
        else:
            values["text_input"] = self.prompt or ""
        if self.max_tokens is not None:
            values["max_tokens"] = self.max_tokens
        if self.truncate_to_fit:
            values["truncate_to_fit"] = True
        return values

    def inputs(self, index: int = 0) -> dict[str, np.ndarray]:
        """Ensemble inputs for sequence `index` of this job. Only what differs from the models'
        defaults is sent."""
        values = self.prompt_inputs()
        values["stream"] = self.stream and not self.beam_search
        if self.beam_search:
            values["beam_width"] = self.best_of  # deterministic: no sampling inputs
        elif self.temperature == 0:
            values["temperature"] = 0.0  # greedy
        else:
            values["temperature"] = self.temperature
            values["top_p"] = self.top_p  # 1.0 is "no limit" (the engine's 0 would mean greedy)
            if self.top_k:
                values["top_k"] = self.top_k
            if self.seed is not None:
                values["random_seed"] = (self.seed + index) % _SEED_SPACE
        for name, default in (
            ("presence_penalty", 0.0),
            ("frequency_penalty", 0.0),
            ("repetition_penalty", 1.0),
        ):
            if getattr(self, name) != default:
                values[name] = getattr(self, name)
        if self.min_tokens:
            values["min_length"] = self.min_tokens
        if self.stop:
            values["stop_words"] = self.stop
        if self.stop_token_ids:
            values["stop_token_ids"] = self.stop_token_ids
        if self.ignore_eos:
            values["ignore_eos"] = True
        if not self.skip_special_tokens:
            values["skip_special_tokens"] = False
        if self.include_stop_str_in_output:
            values["include_stop_str_in_output"] = True
        if self.with_logprobs:
            values["return_log_probs"] = True
            if self.logprobs:
                values["top_logprobs"] = self.logprobs
            if self.echo and self.logprobs is not None:
                values["return_prompt_log_probs"] = True
        return tensors(ENSEMBLE, **values)


@dataclass
class Prompt:
    """The prompt's tokens, for `echo` with logprobs (the frontend has no tokenizer)."""

    ids: list[int]
    texts: list[str]


# Engine and preprocessing tensors named in their error messages -> the API's field.
_PARAMS = {
    "request_output_len": "max_tokens",
    "max_tokens": "max_tokens",
    "input_ids": "prompt",
    "text_input": "prompt",
    "chat_messages": "prompt",
    "chat_template_kwargs": "chat_template_kwargs",
    "stop_token_ids": "stop_token_ids",
    "num_top_log_probs": "logprobs",
}
_LEADING_NAME = re.compile(r"^(\w+)")


def _named(error: APIError, job: Job) -> APIError:
    """A model's 4xx in the API's words: `param` is the request field the message starts with (as
    a tensor name), and the message calls it by that field's name."""
    if error.status >= 500 or error.param is not None:
        return error
    match = _LEADING_NAME.match(error.message)
    param = _PARAMS.get(match.group(1)) if match else None
    if param is None:
        return error
    param = {"max_tokens": job.max_tokens_param, "prompt": job.prompt_param}.get(param, param)
    error.message = re.sub(rf"\b{match.group(1)}\b", param, error.message)
    error.param = param
    return error


async def _steps(triton: Triton, job: Job, index: int) -> AsyncGenerator[Step, None]:
    # aclosing: closing this generator closes Triton's stream now, which cancels the request.
    upstream = triton.stream(ENSEMBLE, job.inputs(index), step_outputs(job.with_logprobs))
    async with contextlib.aclosing(upstream) as responses:
        try:
            async for outputs in responses:
                yield parse_step(outputs, job.with_logprobs)
        except APIError as error:
            raise _named(error, job) from None


async def _generate(triton: Triton, job: Job, index: int) -> Generation:
    return await collect(_steps(triton, job, index))


async def _beams(triton: Triton, job: Job) -> list[Generation]:
    """Beam search: the final response holds every beam, best first."""
    beams: list[Generation] = []
    upstream = triton.stream(ENSEMBLE, job.inputs(), step_outputs(job.with_logprobs))
    async with contextlib.aclosing(upstream) as responses:
        try:
            async for outputs in responses:
                for b in range(beam_count(outputs)):
                    while len(beams) <= b:
                        beams.append(Generation())
                    beams[b].add(parse_step(outputs, job.with_logprobs, beam=b))
        except APIError as error:
            raise _named(error, job) from None
    if not beams or not all(g.finish_reason for g in beams):
        raise APIError(500, "inference failed: the generation ended without a finish reason")
    return beams[: job.n]


async def _gather(work: list[Any]) -> list[Any]:
    """Run coroutines together; the first failure cancels the rest (and so their Triton requests)."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def complete(triton: Triton, job: Job) -> list[Generation]:
    """The job's n returned sequences, in choice order."""
    if job.beam_search:
        return await _beams(triton, job)
    results = await _gather([_generate(triton, job, i) for i in range(job.best_of)])
    if job.ranked:
        results.sort(
            key=lambda g: g.cum_log_prob if g.cum_log_prob is not None else float("-inf"), reverse=True
        )
    return results[: job.n]


async def complete_all(triton: Triton, jobs: list[Job]) -> list[list[Generation]]:
    return await _gather([complete(triton, job) for job in jobs])


async def prompt_tokens(triton: Triton, job: Job) -> Prompt:
    out = await triton.infer(PREPROCESSING, tensors(PREPROCESSING, **job.prompt_inputs()))
    texts = out.get("input_token_texts", np.array([], dtype=object)).reshape(-1)
    return Prompt(
        ids=[int(i) for i in out["input_ids"].reshape(-1)],
        texts=[t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t) for t in texts],
    )


async def stream_all(triton: Triton, jobs: list[Job]) -> AsyncGenerator[tuple[int, Step], None]:
    """(choice index, step) as the responses arrive; choice index = job index * n + sequence.
    Streaming never ranks (best_of == n), so every sequence is a choice."""
    sources = [(j * job.n + i, _steps(triton, job, i)) for j, job in enumerate(jobs) for i in range(job.n)]
    if len(sources) == 1:
        index, only = sources[0]
        async with contextlib.aclosing(only):
            async for step in only:
                yield index, step
        return
    queue: asyncio.Queue[tuple[int, Step | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, source: AsyncGenerator[Step, None]) -> None:
        try:
            async with contextlib.aclosing(source):
                async for step in source:
                    await queue.put((index, step, None))
            await queue.put((index, None, None))
        except Exception as error:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put((index, None, error))

    tasks = [asyncio.ensure_future(pump(index, source)) for index, source in sources]
    try:
        running = len(tasks)
        while running:
            index, step, error = await queue.get()
            if error is not None:
                raise error
            if step is None:
                running -= 1
                continue
            yield index, step
    finally:
        # Cancelling a pump closes its source, whose Triton stream is then cancelled.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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


def stop_reason(gen: Generation, job: Job) -> str | int | None:
    """What stopped a sequence early (vLLM's `stop_reason`): the stop token id or stop string;
    None for the end token, the length limit, or a model's own end-of-turn token."""
    if gen.finish_reason != "stop_words":
        return None
    last: Token | None = gen.tokens[-1] if gen.tokens else None
    if last is not None and last.id in job.stop_token_ids:
        return last.id
    return gen.stop_reason or None


async def first_item(upstream: AsyncIterator[Any]) -> Any:
    async for item in upstream:
        return item
    raise APIError(500, "inference failed: Triton returned no response")
