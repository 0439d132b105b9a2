"""An Anthropic Messages request as the chat path's `Job`: its blocks as chat messages for the
model's chat template, its tools as a `ToolSpec` (frontend.chat_tools), `thinking` as the template's
`enable_thinking`, its images as media references the route fetches (frontend.media).

- `system` is the first message; text blocks are text parts (preprocessing joins them by newlines).
- A user message's `tool_result` blocks become `tool` messages, in block order around its text;
  `is_error` results are written `Error: <content>` (chat templates know no error flag).
- An assistant message's `tool_use` blocks are its `tool_calls`; its `thinking` blocks are dropped,
  as Anthropic drops earlier turns' thinking from the context.
- `thinking` enabled / disabled sets `enable_thinking` true / false (absent: false, Anthropic's
  default). A template without thinking ignores it: the reply then has no thinking block (vLLM does
  the same). `budget_tokens` must be below `max_tokens`, as Anthropic's; the thought is bounded by
  `max_tokens` only.
"""

from __future__ import annotations

import json
from typing import Any

from frontend.anthropic.schema import (
    ASSISTANT_BLOCKS,
    USER_BLOCKS,
    CountTokensRequest,
    ImageBlock,
    MessagesRequest,
    TextBlock,
    ThinkingEnabled,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from frontend.chat_tools.tools import FunctionDefinition, NamedFunction, Tool, ToolChoiceObject, tool_spec
from frontend.engine_client.request import Job
from frontend.media.parts import MediaRef
from frontend.openai_api.schema import bad_request, tools_guide


def prompt_job(req: CountTokensRequest) -> tuple[Job, list[MediaRef]]:
    """The Job that renders the request's prompt (all count_tokens needs), and its images."""
    messages, refs = chat_messages(req)
    thinking = isinstance(req.thinking, ThinkingEnabled)
    job = Job(
        messages=messages,
        chat_template_kwargs={"enable_thinking": thinking},
        tools=_tools(req),
        prompt_param="messages",
    )
    return job, refs


def create_job(req: MessagesRequest) -> tuple[Job, list[MediaRef]]:
    """The whole generation: the prompt's Job with its sampling, stops and token limit."""
    job, refs = prompt_job(req)
    if isinstance(req.thinking, ThinkingEnabled) and req.thinking.budget_tokens >= req.max_tokens:
        raise bad_request(
            f"must be less than max_tokens ({req.max_tokens}), got {req.thinking.budget_tokens}",
            "thinking.budget_tokens",
        )
    job.max_tokens = req.max_tokens
    job.temperature = req.temperature  # None: the model's default (Job.sampling), else Anthropic's 1.0
    job.top_p = req.top_p
    job.top_k = req.top_k
    job.stop = list(req.stop_sequences or [])
    job.stream = bool(req.stream)
    job.priority = req.priority or 0
    tools_guide(job)  # tool_choice any / tool: the grammar makes the reply that call
    return job, refs


def chat_messages(req: CountTokensRequest) -> tuple[list[dict[str, Any]], list[MediaRef]]:
    if not req.messages:
        raise bad_request("must have at least one message", "messages")
    if req.messages[-1].role == "assistant":
        raise bad_request(
            "a last assistant message (a prefill of the reply) is not supported; end with a user message",
            f"messages.{len(req.messages) - 1}",
        )
    out: list[dict[str, Any]] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system)})
    refs: list[MediaRef] = []
    call_ids: set[str] = set()
    for i, message in enumerate(req.messages):
        where = f"messages.{i}"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        allowed = USER_BLOCKS if message.role == "user" else ASSISTANT_BLOCKS
        for j, block in enumerate(message.content):
            if block.type not in allowed:
                raise bad_request(
                    f"a {message.role} message holds no {block.type} block; it takes {', '.join(allowed)}",
                    f"{where}.content.{j}",
                )
        if message.role == "user":
            out += _user(message.content, where, refs, call_ids)
        else:
            out.append(_assistant(message.content, call_ids))
    return out, refs


def _text(value: str | list[TextBlock]) -> str | list[dict[str, Any]]:
    return value if isinstance(value, str) else [{"type": "text", "text": b.text} for b in value]


def _user(blocks: list[Any], where: str, refs: list[MediaRef], call_ids: set[str]) -> list[dict[str, Any]]:
    """The user turn's messages: each tool result a `tool` message, the text and images between
    them user messages (placeholders where the images go)."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, ToolResultBlock):
            if block.tool_use_id not in call_ids:
                raise bad_request(
                    "answers no tool_use block of an earlier assistant message",
                    f"{where}.content.{j}.tool_use_id",
                )
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            text = block.text()
            content = f"Error: {text}" if block.is_error else text
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        elif isinstance(block, ImageBlock):
            refs.append(MediaRef("image", block.url(), f"{where}.content.{j}", "image"))
            parts.append({"type": "image", "image": "<image>"})
        else:
            parts.append({"type": "text", "text": block.text})
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(blocks: list[Any], call_ids: set[str]) -> dict[str, Any]:
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    calls = [
        {
            "id": b.id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
        }
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    call_ids.update(call["id"] for call in calls)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(req: CountTokensRequest) -> Any:
    """Anthropic's tools and tool_choice as the chat path's ToolSpec (None: a text reply)."""
    tools = [
        Tool(
            type="function",
            function=FunctionDefinition(name=t.name, description=t.description, parameters=t.input_schema),
        )
        for t in req.tools or []
    ]
    choice, parallel = req.tool_choice, True
    if choice is not None and not isinstance(choice, ToolChoiceNone):
        parallel = not choice.disable_parallel_tool_use
    if choice is None:
        named: Any = None
    elif isinstance(choice, ToolChoiceTool):
        named = ToolChoiceObject(type="function", function=NamedFunction(name=choice.name))
    elif isinstance(choice, ToolChoiceAny):
        named = "required"
    else:
        named = choice.type  # auto, none
    return tool_spec(tools or None, named, parallel)
