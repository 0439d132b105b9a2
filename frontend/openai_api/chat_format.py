"""OpenAI chat completions' JSON: a choice's `message` (content, reasoning_content,
tool_calls as frontend.chat_tools reads the reply), its `logprobs`, the stream's deltas, and the
timings that API adds after `usage`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frontend.chat_tools.reply import ReplyDelta, ReplyReader, reply_reader, tool_call_deltas, tool_calls_json
from frontend.engine_client.request import Job
from frontend.engine_client.steps import Generation, Prompt, Step, Token, TopToken
from frontend.openai_api.format import Format, Usage, finish_reason, logprob


def _top_entry(top: TopToken) -> dict[str, Any]:
    return {"token": top.text, "logprob": logprob(top.logprob), "bytes": list(top.text.encode("utf-8"))}


def chat_logprobs(tokens: list[Token], k: int) -> dict[str, Any]:
    """OpenAI's chat `logprobs`: per token its text, log prob, UTF-8 bytes and k alternatives."""
    return {
        "content": [
            {
                "token": t.text,
                "logprob": logprob(t.logprob),
                "bytes": list(t.text.encode("utf-8")),
                "top_logprobs": [_top_entry(a) for a in t.top[:k]],
            }
            for t in tokens
        ]
    }


def chat_finish_reason(reply: ReplyReader, engine_reason: str, job: Job) -> str | None:
    reason = finish_reason(engine_reason)
    if reason is None or not reply.called:
        return reason
    return "function_call" if legacy(job) else "tool_calls"


def legacy(job: Job) -> bool:
    """Asked with the deprecated functions: the reply's one call is its `function_call`."""
    return job.tools is not None and job.tools.legacy


def function_call(calls: list[dict[str, Any]], delta: bool) -> dict[str, Any] | None:
    """The deprecated `function_call` of a message (or a delta: its first call's fragments): the
    first call's name and arguments, as a legacy request makes one call a reply."""
    first = [c for c in calls if c["index"] == 0] if delta else calls[:1]
    if not first:
        return None
    merged: dict[str, Any] = {}
    for fn in (c["function"] for c in first):
        if "name" in fn:
            merged["name"] = fn["name"]
        merged["arguments"] = merged.get("arguments", "") + fn["arguments"]
    return merged


def timings_json(u: Usage) -> dict[str, Any]:
    """Seed 001's chat extras, in whole milliseconds like its examples."""
    return {"prefill_time": round(u.prefill_ms), "decode_time_arr": [round(ms) for ms in u.decode_ms]}


@dataclass
class ChatFormat(Format):
    ID_PREFIX = "chatcmpl"
    OBJECT = "chat.completion"
    CHUNK_OBJECT = "chat.completion.chunk"

    # How replies are read (frontend.chat_tools): the model's tool-call format, and "think" to
    # split <think> blocks off as reasoning_content ("none": never).
    tool_parser: str = "hermes"
    reasoning_parser: str = "think"

    def reader(self, job: Job) -> ReplyReader:
        return reply_reader(job.tools, job.chat_template_kwargs, self.tool_parser, self.reasoning_parser)

    def lists_tool_calls(self, calls: list[dict[str, Any]], delta: bool) -> bool:
        """Seed 001 lists `tool_calls` in every whole message, a delta only when there are some."""
        return bool(calls) or not delta

    def message(self, reply: ReplyReader, part: ReplyDelta, delta: bool, job: Job) -> dict[str, Any]:
        """A message (or a stream delta) from what the reader found: content, reasoning_content
        when there is thought, tool_calls (a legacy request's: function_call)."""
        calls = (tool_call_deltas if delta else tool_calls_json)(part.calls, reply)
        content: str | None = part.content
        if calls and not content:
            content = None  # OpenAI's shape of a reply that is only calls
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if part.reasoning:
            message["reasoning_content"] = part.reasoning
        if legacy(job):
            if (call := function_call(calls, delta)) is not None:
                message["function_call"] = call
        elif self.lists_tool_calls(calls, delta):
            message["tool_calls"] = calls
        return message

    def choice(self, index: int, gen: Generation, job: Job, prompt: Prompt | None) -> dict[str, Any]:
        reply = self.reader(job)
        part = reply.feed(gen.text)
        part += reply.finish()
        return {
            "index": index,
            "message": self.message(reply, part, delta=False, job=job),
            "logprobs": chat_logprobs(gen.tokens, job.logprobs or 0) if job.logprobs is not None else None,
            "finish_reason": chat_finish_reason(reply, gen.finish_reason, job),
        }

    def choice_stream(self, index: int, gen: Generation, job: Job, prompt: Prompt | None) -> ChatChoiceStream:
        return ChatChoiceStream(self, index, gen, job)

    def extras(self, u: Usage) -> dict[str, Any]:
        return timings_json(u)

    def as_chunk_choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        choice["delta"] = choice.pop("message")
        return choice


class ChatChoiceStream:
    """One chat choice of a stream: a delta per step, read by the choice's own reply reader."""

    def __init__(self, fmt: ChatFormat, index: int, gen: Generation, job: Job) -> None:
        self.format, self.index, self.gen, self.job = fmt, index, gen, job
        self.reply = fmt.reader(job)
        self.text = ""  # the content so far

    def push(self, step: Step) -> dict[str, Any]:
        self.gen.add(step)
        part = self.reply.feed(step.text)
        if step.finish_reason:
            part += self.reply.finish()
        self.text += part.content
        if self.format.full_text:
            part.content = self.text
        choice: dict[str, Any] = {
            "index": self.index,
            "delta": self.format.message(self.reply, part, delta=True, job=self.job),
        }
        if self.job.logprobs is not None:
            choice["logprobs"] = chat_logprobs(step.tokens, self.job.logprobs)
        choice["finish_reason"] = chat_finish_reason(self.reply, step.finish_reason, self.job)
        return choice
