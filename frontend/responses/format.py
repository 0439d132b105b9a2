"""The Responses API's JSON: the response object (its echoed request fields, output items, usage) and
its stream's semantic events.

One `Output` builds the output items for both: it is fed what the chat path's `ReplyReader` reads
(reasoning, text, tool-call fragments) and says each change as events; a whole response is the same
`Output` fed once, so a stream's final response equals the whole one (greedy).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from frontend.chat_tools.reasoning import CLOSE
from frontend.chat_tools.reply import ReplyDelta, ReplyReader
from frontend.engine_client.steps import Generation, Token
from frontend.openai_api.chat_format import chat_logprobs
from frontend.responses.schema import ResponsesRequest
from frontend.sampling_defaults import SamplingDefaults

Event = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def token_logprobs(tokens: list[Token], k: int) -> list[dict[str, Any]]:
    """An output_text's `logprobs`: chat's per-token entries (token, logprob, bytes, top_logprobs)."""
    return chat_logprobs(tokens, k)["content"]


@dataclass
class Output:
    """The output items of one reply, in the order they appear: a reasoning item, a message, function
    calls. `feed` returns the stream events of what changed; `finish` closes every item."""

    reader: ReplyReader
    logprobs: int | None = None  # alternatives per token; None: no logprobs
    items: list[dict[str, Any]] = field(default_factory=list)
    _reasoning: dict[str, Any] | None = None
    _message: dict[str, Any] | None = None
    _calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    _tokens: list[Token] = field(default_factory=list)  # not yet on a text delta

    def feed(self, part: ReplyDelta, tokens: list[Token]) -> list[Event]:
        events: list[Event] = []
        self._tokens += tokens
        if part.reasoning:
            if self._reasoning is None:
                self._reasoning = self._add(
                    events, {"type": "reasoning", "summary": []}, "rs", "reasoning_text"
                )
            events.append(self._delta(self._reasoning, "response.reasoning_text.delta", part.reasoning))
        if part.content:
            if self._message is None:
                self._message = self._add(
                    events, {"type": "message", "role": "assistant"}, "msg", "output_text"
                )
            delta = self._delta(self._message, "response.output_text.delta", part.content)
            delta["logprobs"] = self._take_logprobs()
            events.append(delta)
        for e in part.calls:
            call = self._calls.get(e.index)
            if call is None:
                item = {
                    "type": "function_call",
                    "call_id": self.reader.call_id(e.index),
                    "name": e.name or "",
                }
                call = self._calls[e.index] = self._add(events, {**item, "arguments": ""}, "fc", None)
            if e.arguments:
                call["arguments"] += e.arguments
                events.append(self._event("response.function_call_arguments.delta", call, delta=e.arguments))
        return events

    def finish(self, status: str) -> list[Event]:
        """Every item done (`status`: completed or incomplete), in output order."""
        events: list[Event] = []
        for index, item in enumerate(self.items):
            item["status"] = status
            if item["type"] == "function_call":
                done = self._event("response.function_call_arguments.done", item, arguments=item["arguments"])
                events.append({**done, "name": item["name"]})
            else:
                part = item["content"][0]
                kind = "output_text" if item["type"] == "message" else "reasoning_text"
                text_done = self._event(f"response.{kind}.done", item, content_index=0, text=part["text"])
                if item["type"] == "message":
                    self._take_logprobs()  # the tokens after the last text delta
                    text_done["logprobs"] = part.get("logprobs", [])
                events += [
                    text_done,
                    self._event("response.content_part.done", item, content_index=0, part=part),
                ]
            events.append({"type": "response.output_item.done", "output_index": index, "item": item})
        return events

    # -- events ------------------------------------------------------------------------------------

    def _add(
        self, events: list[Event], item: dict[str, Any], prefix: str, part: str | None
    ) -> dict[str, Any]:
        item = {"id": new_id(prefix), **item, "status": "in_progress"}
        if part is not None:
            item["content"] = []
        self.items.append(item)
        events.append(
            {"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": _copy(item)}
        )
        if part is not None:
            empty: dict[str, Any] = {"type": part, "text": ""}
            if part == "output_text":
                empty |= {"annotations": [], **({"logprobs": []} if self.logprobs is not None else {})}
            item["content"].append(empty)
            events.append(
                self._event("response.content_part.added", item, content_index=0, part=_copy(empty))
            )
        return item

    def _delta(self, item: dict[str, Any], kind: str, text: str) -> Event:
        item["content"][0]["text"] += text
        return self._event(kind, item, content_index=0, delta=text)

    def _event(self, kind: str, item: dict[str, Any], **fields: Any) -> Event:
        return {"type": kind, "item_id": item["id"], "output_index": self.items.index(item), **fields}

    def _take_logprobs(self) -> list[dict[str, Any]]:
        if self.logprobs is None:
            self._tokens = []
            return []
        taken, self._tokens = token_logprobs(self._tokens, self.logprobs), []
        if self._message is not None:
            self._message["content"][0]["logprobs"] += taken
        return taken


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in item.items()}


# ---------------------------------------------------------------------------------------------
# The response object.


def reasoning_tokens(gen: Generation, reasoning: str) -> int:
    """How many generated tokens were thought: those up to the thought's closing tag (all of them
    when the thought never closed)."""
    if not reasoning:
        return 0
    end = gen.text.find(CLOSE)
    if end < 0:
        return len(gen.tokens)
    end += len(CLOSE)
    seen = 0
    for count, token in enumerate(gen.tokens, start=1):
        seen += len(token.text)
        if seen >= end:
            return count
    return len(gen.tokens)


def usage_json(gen: Generation, reasoning: int) -> dict[str, Any]:
    prompt, output = gen.prompt_tokens or 0, len(gen.tokens)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": gen.cached_tokens or 0, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output,
    }


@dataclass
class Envelope:
    """What every response object of one request repeats: its id, the model, the request's fields."""

    req: ResponsesRequest
    model: str
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)  # the model's: echoed where unset
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        req = self.req
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        choice = req.tool_choice
        if choice is not None and not isinstance(choice, str):
            choice = {"type": "function", "name": choice.function.name}
        reasoning = req.reasoning.model_dump(exclude_none=True) if req.reasoning else {}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "store": req.store is not False,
            "temperature": self.defaults.value("temperature", req.temperature),
            "text": {"format": (req.text.format if req.text and req.text.format else {"type": "text"})},
            "tool_choice": choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_logprobs": req.top_logprobs,
            "top_p": self.defaults.value("top_p", req.top_p),
            "truncation": req.truncation or "disabled",
            "usage": usage,
            "metadata": req.metadata or {},
        }


def status_of(gen: Generation) -> str:
    """`incomplete` when the token limit (max_output_tokens, or the model's context) cut the reply."""
    return "incomplete" if gen.finish_reason == "length" else "completed"


def closing(envelope: Envelope, output: Output, gen: Generation) -> tuple[list[Event], dict[str, Any]]:
    """A finished generation's last item events and its response object (status, output, usage)."""
    status = status_of(gen)
    events = output.finish(status)
    reasoning = "".join(i["content"][0]["text"] for i in output.items if i["type"] == "reasoning")
    return events, envelope.body(status, output.items, usage_json(gen, reasoning_tokens(gen, reasoning)))


def whole(envelope: Envelope, output: Output, gen: Generation) -> dict[str, Any]:
    """The response object of a finished generation (not streamed): the reader fed once."""
    part = output.reader.feed(gen.text)
    part += output.reader.finish()
    output.feed(part, gen.tokens)
    return closing(envelope, output, gen)[1]
