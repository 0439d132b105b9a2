"""Request bodies of Anthropic's Messages API: `POST /v1/messages` and
`POST /v1/messages/count_tokens`.

Every field we serve with its type and range; JSON types are strict and unknown fields are refused
(400 naming them), so nothing Anthropic's API takes is silently ignored: its server tools, `container`,
`service_tier`, citations, documents, `output_config` and the rest get a 400 that names the field.
`cache_control` is accepted wherever Anthropic takes it: the engine's prefix cache already keeps
every prompt's KV blocks, so marking a prefix adds nothing (the reuse shows in
`usage.cache_read_input_tokens`). Content blocks are read by their `type`, so an error names the block
(`messages.0.content.1.source`) rather than a union's branches. `convert` turns a request into a Job.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from frontend.field_rules import MAX_INT32, Priority, number
from frontend.media.parts import parts_validator
from frontend.openai_api.schema import STRICT_BODY, Flag

MIN_THINKING_BUDGET = 1024  # Anthropic's least budget_tokens


def _tool_name(value: str) -> str:
    if not value or len(value) > 64 or not all(c.isalnum() or c in "_-" for c in value):
        raise ValueError("must be 1 to 64 letters, digits, underscores or dashes")
    return value


class CacheControl(BaseModel):
    model_config = STRICT_BODY
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(BaseModel):
    model_config = STRICT_BODY
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class Base64Source(BaseModel):
    model_config = STRICT_BODY
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(BaseModel):
    model_config = STRICT_BODY
    type: Literal["url"]
    url: str


class ImageBlock(BaseModel):
    model_config = STRICT_BODY
    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]
    cache_control: CacheControl | None = None

    def url(self) -> str:
        """Where the frontend's media sources fetch it: a data: URL for base64."""
        if isinstance(self.source, Base64Source):
            return f"data:{self.source.media_type};base64,{self.source.data}"
        return self.source.url


class ToolUseBlock(BaseModel):
    model_config = STRICT_BODY
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(BaseModel):
    model_config = STRICT_BODY
    type: Literal["tool_result"]
    tool_use_id: str
    # Text only: a tool result's images would need a template that shows media in tool messages.
    content: Annotated[str | list[Any] | None, parts_validator({"text": TextBlock}, "a string")] = None
    is_error: Flag = None
    cache_control: CacheControl | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(block.text for block in self.content)


class ThinkingBlock(BaseModel):
    model_config = STRICT_BODY
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(BaseModel):
    model_config = STRICT_BODY
    type: Literal["redacted_thinking"]
    data: str


USER_BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "image": ImageBlock,
    "tool_result": ToolResultBlock,
}
ASSISTANT_BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}
ALL_BLOCKS = {**USER_BLOCKS, **ASSISTANT_BLOCKS}


class Message(BaseModel):
    """One turn; which blocks each role may hold is checked in `convert` (naming the block)."""

    model_config = STRICT_BODY
    role: Literal["user", "assistant"]
    content: Annotated[str | list[Any], parts_validator(ALL_BLOCKS, "a string")]


class Tool(BaseModel):
    """A client tool (Anthropic's `custom`); server tools (bash, web search, …) have other types."""

    model_config = STRICT_BODY
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _tool_name(value)

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError('must be a JSON schema of an object ({"type": "object", …})')
        return value


class ToolChoiceAuto(BaseModel):
    model_config = STRICT_BODY
    type: Literal["auto"]
    disable_parallel_tool_use: Flag = None


class ToolChoiceAny(BaseModel):
    model_config = STRICT_BODY
    type: Literal["any"]
    disable_parallel_tool_use: Flag = None


class ToolChoiceTool(BaseModel):
    model_config = STRICT_BODY
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: Flag = None


class ToolChoiceNone(BaseModel):
    model_config = STRICT_BODY
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class ThinkingEnabled(BaseModel):
    model_config = STRICT_BODY
    type: Literal["enabled"]
    budget_tokens: Annotated[int, number(MIN_THINKING_BUDGET, MAX_INT32, integer=True)]


class ThinkingDisabled(BaseModel):
    model_config = STRICT_BODY
    type: Literal["disabled"]


Thinking = Annotated[ThinkingEnabled | ThinkingDisabled, Field(discriminator="type")]


class Metadata(BaseModel):
    model_config = STRICT_BODY
    user_id: Annotated[str, Field(max_length=256)] | None = None


class CountTokensRequest(BaseModel):
    """What decides the prompt: `POST /v1/messages/count_tokens`, and the head of a create."""

    model_config = STRICT_BODY

    model: str
    messages: list[Message]
    system: Annotated[str | list[Any] | None, parts_validator({"text": TextBlock}, "a string")] = None
    tools: list[Tool] | None = None  # at most chat_tools.tools.MAX_TOOLS
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: Annotated[int, number(1, MAX_INT32, integer=True)]
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    temperature: Annotated[float | None, number(0.0, 1.0)] = None
    top_p: Annotated[float | None, number(0.0, 1.0, low_open=True)] = None
    top_k: Annotated[int | None, number(0, MAX_INT32, integer=True)] = None
    metadata: Metadata | None = None
    stream: Flag = None
    priority: Priority = None  # vLLM's (an extension here): lower runs first
