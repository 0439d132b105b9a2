"""The body of `POST /v1/responses` (OpenAI's Responses API): every field we serve, with its type,
range and default, and OpenAI's other fields declared as refused, so that none is silently ignored.

Input items are validated here into plain shapes (`frontend.responses.convert` turns them into chat
messages); rules that tie fields together are checked when the request becomes a Job (`convert`),
each a 400 naming its field. JSON types are strict and `null` means "not given", as on the chat API.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from frontend.chat_tools.tools import FunctionDefinition, NamedFunction, ToolChoiceObject
from frontend.field_rules import Metadata, Priority, bounded_text, number, refused
from frontend.media.parts import parts_validator
from frontend.openai_api.fields import ServiceHints
from frontend.openai_api.schema import (
    MAX_PROMPT_CHARS,
    MAX_TOP_LOGPROBS,
    STRICT_BODY,
    Flag,
    MaxTokens,
    TopP,
)

LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the one `include` value we serve


# One of OpenAI's parameters we do not serve: given (not null), a 400 naming it.
Refused = refused()


# ---------------------------------------------------------------------------------------------
# Content parts and input items.


class InputText(BaseModel):
    model_config = STRICT_BODY
    type: Literal["input_text"]
    text: str


class InputImage(BaseModel):
    model_config = STRICT_BODY
    type: Literal["input_image"]
    image_url: str  # a data: URL, an allowed local path / file:// URL, or an http(s) URL
    detail: Literal["auto"] | None = None  # no other resolution setting: the model's processor decides
    file_id: Refused = None


class OutputText(BaseModel):
    """An earlier reply's text, as a response's `output` lists it (clients send those items back)."""

    model_config = STRICT_BODY
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(BaseModel):
    model_config = STRICT_BODY
    type: Literal["refusal"]
    refusal: str


_INPUT_PARTS: dict[str, type[BaseModel]] = {"input_text": InputText, "input_image": InputImage}
_OUTPUT_PARTS: dict[str, type[BaseModel]] = {"output_text": OutputText, "refusal": Refusal}
_ALL_PARTS = {**_INPUT_PARTS, **_OUTPUT_PARTS}


class MessageItem(BaseModel):
    model_config = STRICT_BODY
    type: Literal["message"]
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[str | list[Any], parts_validator(_ALL_PARTS, "a string")]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @model_validator(mode="after")
    def _parts_of_role(self) -> MessageItem:
        allowed = _OUTPUT_PARTS if self.role == "assistant" else _INPUT_PARTS
        for j, part in enumerate(self.content if isinstance(self.content, list) else []):
            if part.type not in allowed:
                names = ", ".join(repr(t) for t in allowed)
                raise ValueError(f"content[{j}].type: the parts of a {self.role} message are {names}")
        return self


class FunctionCallItem(BaseModel):
    model_config = STRICT_BODY
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = STRICT_BODY
    type: Literal["function_call_output"]
    call_id: str
    output: Annotated[str | list[Any], parts_validator({"input_text": InputText}, "a string")]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ReasoningItem(BaseModel):
    """An earlier reply's reasoning, sent back by a client: accepted, and not shown to the model (as
    chat templates drop earlier turns' thoughts)."""

    model_config = STRICT_BODY
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    encrypted_content: Refused = None


_ITEMS: dict[str, type[BaseModel]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def _message_type(value: Any) -> Any:
    """OpenAI's shorthand message `{"role", "content"}` has no `type`."""
    if isinstance(value, list):
        return [
            {"type": "message", **v} if isinstance(v, dict) and "type" not in v and "role" in v else v
            for v in value
        ]
    if isinstance(value, str):
        return bounded_text(value, MAX_PROMPT_CHARS)
    return value


Input = Annotated[str | list[Any], parts_validator(_ITEMS, "a string"), BeforeValidator(_message_type)]


# ---------------------------------------------------------------------------------------------
# Tools, text format, reasoning.


class FunctionTool(FunctionDefinition):
    """Responses' flat function tool: `{"type": "function", "name", "parameters", "strict", ...}`."""

    type: Literal["function"]


def _function_tools(value: Any) -> Any:
    """Only function tools are served: one clear error naming the first other tool's type."""
    for i, tool in enumerate(value if isinstance(value, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            message = f'only function tools are served (type "function"), got {kind!r}'
            error = InitErrorDetails(
                type=PydanticCustomError("value_error", message), loc=(i, "type"), input=kind
            )
            raise ValidationError.from_exception_data("tools", [error])
    return value


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and set(value) == {"type", "name"}:
        if isinstance(value["name"], str):
            return ToolChoiceObject(type="function", function=NamedFunction(name=value["name"]))
    raise ValueError('must be "none", "auto", "required" or {"type": "function", "name": "..."}')


ToolChoice = Annotated[Literal["none", "auto", "required"] | ToolChoiceObject, BeforeValidator(_tool_choice)]


class TextConfig(BaseModel):
    model_config = STRICT_BODY
    format: dict[str, Any] | None = None  # text, json_object, json_schema (checked by convert)
    verbosity: Refused = None


class ReasoningConfig(BaseModel):
    model_config = STRICT_BODY
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    # The reasoning comes whole as the item's `content`; "auto" leaves the summary to us: empty.
    summary: Literal["auto"] | None = None
    generate_summary: Literal["auto"] | None = None
    context: Refused = None
    mode: Refused = None


# ---------------------------------------------------------------------------------------------
# POST /v1/responses


class ResponsesRequest(ServiceHints):  # user, service_tier, …: accepted, no effect
    model_config = STRICT_BODY

    model: str
    input: Input
    instructions: str | None = None  # the system message before the conversation
    max_output_tokens: MaxTokens = None
    temperature: Annotated[float | None, number(0.0, 2.0)] = None
    top_p: TopP = None
    top_logprobs: Annotated[int | None, number(0, MAX_TOP_LOGPROBS, integer=True)] = None
    include: list[Literal["message.output_text.logprobs"]] | None = None
    tools: Annotated[list[FunctionTool] | None, BeforeValidator(_function_tools)] = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Flag = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: Flag = None
    store: Flag = None
    previous_response_id: str | None = None
    metadata: Metadata = None
    truncation: Literal["auto", "disabled"] | None = None
    priority: Priority = None  # vLLM's (an extension here): lower runs first
    # OpenAI's parameters this server does not serve.
    background: Refused = None
    conversation: Refused = None
    max_tool_calls: Refused = None
    prompt: Refused = None
    prompt_cache_retention: Refused = None
    stream_options: Refused = None
    context_management: Refused = None
    moderation: Refused = None
    image: Refused = None
    access_programs: Refused = None
    background_options: Refused = None
    prompt_cache_options: Refused = None
