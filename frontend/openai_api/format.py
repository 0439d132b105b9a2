"""The JSON of the OpenAI-style responses: chat completions (seed 001), completions (seed 004) and
Databricks' variants (seed 002), whole or as stream chunks.

A `Stream` turns (choice index, engine step) pairs into chunks: a `delta` (or `text`) per step,
exactly one chunk per choice with its `finish_reason`, and usage (and, in the cumulative-text
mode of seed 001's second streaming example, `full_text`) on the stream's last chunk.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from frontend.chat_tools.reply import ReplyDelta, ReplyReader, reply_reader, tool_call_deltas, tool_calls_json
from frontend.engine_client.request import Job
from frontend.engine_client.steps import Generation, Prompt, Step, Token, TopToken
from frontend.openai_api.jobs import Usage, stop_reason, usage

Kind = Literal["chat", "completion"]
# The engine's finish reasons in OpenAI's words: stopped by the end token, a stop string or a stop
# token id ("stop"), or by max_tokens / the model's context ("length").
FINISH_REASONS = {"end_id": "stop", "stop_words": "stop", "length": "length", "cancelled": "stop"}
MIN_LOGPROB = -9999.0  # JSON has no -inf; what a token with probability 0 reports


def finish_reason(engine_reason: str) -> str | None:
    return FINISH_REASONS.get(engine_reason, engine_reason) if engine_reason else None


def _logprob(value: float | None) -> float:
    return MIN_LOGPROB if value is None or not math.isfinite(value) else max(value, MIN_LOGPROB)


@dataclass
class Meta:
    """What every response and chunk of one request repeats."""

    kind: Kind
    model: str
    databricks: bool = False  # Databricks' shapes (seed 002): plain usage, no timings
    full_text: bool = False  # cumulative stream text (seed 001, fullTextEnabled)
    # How chat replies are read (frontend.chat_tools): the model's tool-call format, and "think"
    # to split <think> blocks off as reasoning_content ("none": never).
    tool_parser: str = "hermes"
    reasoning_parser: str = "think"
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"

    def envelope(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            # Seed 002 spells the non-streamed object "chat.completions"; OpenAI "chat.completion".
            obj = (
                "chat.completion.chunk"
                if chunk
                else ("chat.completions" if self.databricks else "chat.completion")
            )
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def usage_json(meta: Meta, u: Usage) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }
    if meta.databricks:
        return body
    return {
        "prompt_tokens": u.prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "batch_size": u.batch_size,
        "queue_wait_time": u.queue_wait_us,  # µs, one entry per generated token
    }


def timings_json(u: Usage) -> dict[str, Any]:
    """Seed 001's chat extras, in whole milliseconds like its examples."""
    return {"prefill_time": round(u.prefill_ms), "decode_time_arr": [round(ms) for ms in u.decode_ms]}


# ---------------------------------------------------------------------------------------------
# Log probs


def _top_entry(top: TopToken) -> dict[str, Any]:
    return {"token": top.text, "logprob": _logprob(top.logprob), "bytes": list(top.text.encode("utf-8"))}


def chat_logprobs(tokens: list[Token], k: int) -> dict[str, Any]:
    """OpenAI's chat `logprobs`: per token its text, log prob, UTF-8 bytes and k alternatives."""
    return {
        "content": [
            {
                "token": t.text,
                "logprob": _logprob(t.logprob),
                "bytes": list(t.text.encode("utf-8")),
                "top_logprobs": [_top_entry(a) for a in t.top[:k]],
            }
            for t in tokens
        ]
    }


@dataclass
class CompletionLogprobs:
    """Seed 004's `logprobs` of one choice, built step by step: `text_offset` counts characters of
    the token strings from the start of the choice's text (the prompt too, with echo); each
    `top_logprobs` entry maps the chosen token and its k best alternatives to their log probs."""

    k: int
    offset: int = 0

    def render(self, tokens: list[tuple[str, float | None, list[TopToken] | None]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {
            "text_offset": [],
            "token_logprobs": [],
            "tokens": [],
            "top_logprobs": [],
        }
        for text, logprob, top in tokens:
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            out["tokens"].append(text)
            if top is None or logprob is None:  # the prompt's first token: nothing predicts it
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(_logprob(logprob))
            entry = {text: _logprob(logprob)}
            for alt in top[: self.k]:
                entry.setdefault(alt.text, _logprob(alt.logprob))
            out["top_logprobs"].append(entry)
        return out

    @staticmethod
    def generated(tokens: list[Token]) -> list[tuple[str, float | None, list[TopToken] | None]]:
        return [(t.text, t.logprob, t.top) for t in tokens]

    @staticmethod
    def prompt(prompt: Prompt, gen: Generation) -> list[tuple[str, float | None, list[TopToken] | None]]:
        rows = []
        for i, text in enumerate(prompt.texts):
            logprob = gen.prompt_logprobs[i] if i < len(gen.prompt_logprobs) else None
            top = gen.prompt_top[i] if i < len(gen.prompt_top) else []
            rows.append((text, logprob, None if i == 0 else top))
        return rows


# ---------------------------------------------------------------------------------------------
# Whole responses


def reader(meta: Meta, job: Job) -> ReplyReader:
    return reply_reader(job.tools, job.chat_template_kwargs, meta.tool_parser, meta.reasoning_parser)


def chat_message(meta: Meta, reply: ReplyReader, part: ReplyDelta, delta: bool) -> dict[str, Any]:
    """A message (or a stream delta) from what the reader found: content, reasoning_content when
    there is thought, tool_calls (seed 001 always lists them; Databricks only when there are)."""
    calls = (tool_call_deltas if delta else tool_calls_json)(part.calls, reply)
    content: str | None = part.content
    if calls and not content:
        content = None  # OpenAI's shape of a reply that is only calls
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if part.reasoning:
        message["reasoning_content"] = part.reasoning
    if calls or (not meta.databricks and not delta):
        message["tool_calls"] = calls
    return message


def chat_finish_reason(reply: ReplyReader, engine_reason: str) -> str | None:
    reason = finish_reason(engine_reason)
    return "tool_calls" if reason is not None and reply.called else reason


def chat_choice(meta: Meta, index: int, gen: Generation, job: Job) -> dict[str, Any]:
    reply = reader(meta, job)
    part = reply.feed(gen.text)
    part += reply.finish()
    return {
        "index": index,
        "message": chat_message(meta, reply, part, delta=False),
        "logprobs": chat_logprobs(gen.tokens, job.logprobs or 0) if job.logprobs is not None else None,
        "finish_reason": chat_finish_reason(reply, gen.finish_reason),
    }


def completion_text(job: Job, gen: Generation) -> str:
    return ((job.prompt or "") if job.echo else "") + gen.text + job.suffix


def completion_choice(
    meta: Meta, index: int, gen: Generation, job: Job, prompt: Prompt | None
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": index, "text": completion_text(job, gen)}
    if not meta.databricks:
        choice["logprobs"] = None
        if job.logprobs is not None:
            logprobs = CompletionLogprobs(job.logprobs)
            rows = CompletionLogprobs.prompt(prompt, gen) if prompt is not None else []
            choice["logprobs"] = logprobs.render(rows + CompletionLogprobs.generated(gen.tokens))
        choice["stop_reason"] = stop_reason(gen, job)
    choice["finish_reason"] = finish_reason(gen.finish_reason)
    return choice


def response(
    meta: Meta, jobs: list[Job], choices: list[list[Generation]], prompts: list[Prompt | None]
) -> dict[str, Any]:
    body = meta.envelope(chunk=False)
    items = []
    for j, (job, gens) in enumerate(zip(jobs, choices, strict=True)):
        for i, gen in enumerate(gens):
            index = j * job.n + i
            if meta.kind == "chat":
                items.append(chat_choice(meta, index, gen, job))
            else:
                items.append(completion_choice(meta, index, gen, job, prompts[j]))
    body["choices"] = items
    u = usage(jobs, choices)
    body["usage"] = usage_json(meta, u)
    if meta.kind == "chat" and not meta.databricks:
        body.update(timings_json(u))
    return body


# ---------------------------------------------------------------------------------------------
# Streams


class Stream:
    """Chunks for (choice index, step) pairs of `jobs`; `done` once every choice has finished."""

    def __init__(self, meta: Meta, jobs: list[Job], prompts: list[Prompt | None]) -> None:
        self.meta, self.jobs, self.prompts = meta, jobs, prompts
        self.gens = [[Generation() for _ in range(job.n)] for job in jobs]
        self.logprobs = [CompletionLogprobs(job.logprobs or 0) for job in jobs for _ in range(job.n)]
        self.readers = [reader(meta, job) for job in jobs for _ in range(job.n)]
        self.contents = [""] * len(self.readers)  # each chat choice's content so far (full_text mode)
        self.unfinished = sum(job.n for job in jobs)

    @property
    def done(self) -> bool:
        return self.unfinished == 0

    def push(self, index: int, step: Step) -> dict[str, Any]:
        j, i = self._locate(index)
        job, gen = self.jobs[j], self.gens[j][i]
        first = not gen.tokens and not gen.text and gen.finish_reason == ""
        gen.add(step)
        chunk = self.meta.envelope(chunk=True)
        reason = finish_reason(step.finish_reason)
        if self.meta.kind == "chat":
            reply = self.readers[index]
            part = reply.feed(step.text)
            if reason is not None:
                part += reply.finish()
            self.contents[index] += part.content
            if self.meta.full_text:
                part.content = self.contents[index]
            text = self.contents[index]
            delta = chat_message(self.meta, reply, part, delta=True)
            choice: dict[str, Any] = {"index": index, "delta": delta}
            if job.logprobs is not None:
                choice["logprobs"] = chat_logprobs(step.tokens, job.logprobs)
            choice["finish_reason"] = chat_finish_reason(reply, step.finish_reason)
        else:
            text = gen.text if self.meta.full_text else step.text
            if job.echo and (first or self.meta.full_text):
                text = (job.prompt or "") + text
            if reason is not None:
                text += job.suffix
            choice = {"index": index, "text": text}
            if not self.meta.databricks:
                choice["logprobs"] = None
                if job.logprobs is not None:
                    prompt = self.prompts[j]
                    rows = CompletionLogprobs.prompt(prompt, gen) if first and prompt is not None else []
                    rows += CompletionLogprobs.generated(step.tokens)
                    choice["logprobs"] = self.logprobs[index].render(rows)
                choice["stop_reason"] = stop_reason(gen, job) if reason else None
            choice["finish_reason"] = reason
        chunk["choices"] = [choice]
        if reason is not None:
            self.unfinished -= 1
            if self.done:
                self._finish(chunk, text)
        return chunk

    def _finish(self, chunk: dict[str, Any], text: str) -> None:
        if self.meta.full_text:
            chunk["full_text"] = text  # the last choice's whole text, as its last chunk has it
        if any(job.stream_usage for job in self.jobs):
            chunk["usage"] = usage_json(self.meta, usage(self.jobs, self.gens))

    def _locate(self, index: int) -> tuple[int, int]:
        for j, job in enumerate(self.jobs):
            if index < job.n:
                return j, index
            index -= job.n
        raise IndexError(index)

    def whole(self, choices: list[list[Generation]]) -> dict[str, Any]:
        """Beam search streams "fake": one chunk with every finished choice (seed 004)."""
        body = response(self.meta, self.jobs, choices, self.prompts)
        chunk = self.meta.envelope(chunk=True)
        chunk["choices"] = body["choices"]
        if self.meta.kind == "chat":
            for choice in chunk["choices"]:
                choice["delta"] = choice.pop("message")
        if any(job.stream_usage for job in self.jobs):
            chunk["usage"] = body["usage"]
        return chunk
