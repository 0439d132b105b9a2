"""A Responses request as a chat `Job`: its items (after the stored conversation it continues) become
chat messages for the model's chat template, its tools a `ToolSpec`, `text.format` a guide; from there
the chat completions path runs it (the same template, tool-call and reasoning readers, guides).

Items → messages: `instructions` is the first (system) message; a `developer` message is a system
message; `function_call` items are the `tool_calls` of an assistant message (joined to the assistant
message just before, as a reply with text and calls is); `function_call_output` a `tool` message;
`input_image` a media placeholder whose bytes the multimodal path fetches; `reasoning` items are not
shown (chat templates drop earlier turns' thoughts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frontend.chat_tools.reasoning import effort_kwargs
from frontend.chat_tools.tools import Tool, tool_spec
from frontend.engine_client import guides
from frontend.engine_client.request import Guide, Job
from frontend.errors import APIError
from frontend.field_rules import total_chars
from frontend.media.parts import MediaRef
from frontend.openai_api.schema import MAX_PROMPT_CHARS, bad_request, tools_guide
from frontend.responses.schema import LOGPROBS_INCLUDE, ResponsesRequest

PREVIOUS = "previous_response_id"  # what media of a stored turn is named after in errors


@dataclass
class Turn:
    job: Job
    refs: list[MediaRef]  # the media to fetch, in prompt order
    items: list[dict[str, Any]]  # this request's input items, as plain JSON (stored for later turns)


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return [item.model_dump(exclude_none=True) for item in req.input]


def to_turn(req: ResponsesRequest, history: list[dict[str, Any]], reasoning_parser: str) -> Turn:
    """The Job of `req` continuing `history` (the stored items of `previous_response_id`)."""
    items = input_items(req)
    names = [PREVIOUS] * len(history) + [f"input[{i}]" for i in range(len(items))]
    messages, refs = chat_messages([*history, *items], names)
    if req.instructions is not None:
        messages.insert(0, {"role": "system", "content": req.instructions})
    if not messages:
        raise bad_request("must hold at least one message", "input")
    try:
        total_chars(list(_texts(messages)), MAX_PROMPT_CHARS)
    except ValueError as error:
        raise bad_request(str(error), "input") from None
    tools = [
        Tool(type="function", function=t.model_dump(exclude={"type"}, exclude_none=True))
        for t in req.tools or []
    ]
    job = Job(
        messages=messages,
        chat_template_kwargs=_thinking(req, reasoning_parser),
        tools=tool_spec(tools or None, req.tool_choice, req.parallel_tool_calls),
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,  # None: the model's default (Job.sampling)
        top_p=req.top_p,
        stream=bool(req.stream),
        truncate_to_fit=req.truncation == "auto",
        priority=req.priority or 0,
        prompt_param="input",
        max_tokens_param="max_output_tokens",
        guide_param="text.format",
    )
    job.guide = text_guide(req.text.format if req.text else None)
    tools_guide(job)
    if req.top_logprobs is not None or LOGPROBS_INCLUDE in (req.include or []):
        job.logprobs = req.top_logprobs or 0
    return Turn(job, refs, items)


def chat_messages(
    items: list[dict[str, Any]], names: list[str]
) -> tuple[list[dict[str, Any]], list[MediaRef]]:
    """Items (as JSON) → chat messages, and the media their images name (`names[i]`: item i's field)."""
    messages: list[dict[str, Any]] = []
    refs: list[MediaRef] = []
    for item, name in zip(items, names, strict=True):
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            content = _content(item["content"], name, refs) if role != "assistant" else _text(item["content"])
            messages.append({"role": role, "content": content})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function"}
            call["function"] = {"name": item["name"], "arguments": item["arguments"]}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
            )
    return messages, refs


def _text(content: str | list[dict[str, Any]]) -> str:
    """An assistant message's (or a tool output's) text: its parts joined."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", part.get("refusal", "")) for part in content)


def _content(content: str | list[dict[str, Any]], name: str, refs: list[MediaRef]) -> Any:
    """A user or system message's content: text, or chat parts with each image's placeholder."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if part["type"] == "input_image":
            where = f"{name}.content[{j}]" if name != PREVIOUS else PREVIOUS
            refs.append(MediaRef("image", part["image_url"], where, "input_image"))
            parts.append({"type": "image", "image": "<image>"})
        else:
            parts.append({"type": "text", "text": part["text"]})
    return parts


def _texts(messages: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [p["text"] for p in content if p.get("type") == "text"]
    return out


def text_guide(fmt: dict[str, Any] | None) -> Guide | None:
    """`text.format` as chat's response_format reads it (Responses' json_schema is flat: its name,
    schema, description and strict sit beside `type`); errors name the Responses field."""
    if fmt is None:
        return None
    nested = fmt
    if fmt.get("type") == "json_schema":
        nested = {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    try:
        return guides.response_format(nested, "text.format", name_required=True)
    except APIError as error:
        flat = "text.format.json_schema"
        error.message = error.message.replace(flat, "text.format")
        error.param = error.param.replace(flat, "text.format") if error.param else error.param
        raise


def _thinking(req: ResponsesRequest, reasoning_parser: str) -> dict[str, Any] | None:
    """`reasoning.effort`, by chat completions' `reasoning_effort` rule (effort_kwargs): none and
    minimal turn the template's thinking off, low to max on; a model that does not reason takes any
    effort (agents such as Codex always send one) and answers without a reasoning item."""
    effort = req.reasoning.effort if req.reasoning else None
    return effort_kwargs(effort, reasoning_parser) or None
