"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls` (OpenAI chat completions and
Databricks, OpenAI's function calling): checked into a `ToolSpec`, which says what goes to the chat
template, which grammar enforces a call, and how the reply is read.

- `none` (the default without tools): the tools are not shown to the model; the reply is text.
- `auto` (the default with tools): the model sees them in its chat template and decides; what it
  writes in its own format is read as calls (parser from the chat template, see `parsers`). When
  the template knows no tools (they are written into the prompt in Hermes' format), the reply is
  free text in which each `<tool_call>` block is held to a valid call (`tagged_calls_guide_json`).
- `required` / a named function: the grammar makes the reply a call (a JSON list of
  `{"name", "arguments"}` objects, one when `parallel_tool_calls` is false) or the named function's
  arguments, validated against the tools' `parameters` schemas.
- OpenAI's deprecated `functions` / `function_call` are the same tools and choice, one call per
  reply (`legacy_tool_spec`); the reply then names its call `function_call`, as OpenAI's does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, field_validator

from frontend.errors import APIError

MAX_TOOLS = 32  # Databricks: at most 32 functions
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # Hermes' call blocks (parsers.hermes reads them)
_CONFIG = ConfigDict(extra="forbid", strict=True)


class FunctionDefinition(BaseModel):
    model_config = _CONFIG
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value or len(value) > 64 or not all(c.isalnum() or c in "_-." for c in value):
            raise ValueError("must be 1 to 64 letters, digits, underscores, dashes or dots")
        return value


class Tool(BaseModel):
    model_config = _CONFIG
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = _CONFIG
    name: str


class ToolChoiceObject(BaseModel):
    model_config = _CONFIG
    type: Literal["function"]
    function: NamedFunction


def _tool_choice(value: Any) -> Any:
    """One clear message for both forms (a union would report each form's error)."""
    if value is None or value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict):
        try:
            return ToolChoiceObject.model_validate(value)
        except ValidationError:
            pass
    raise ValueError(
        'must be "none", "auto", "required" or {"type": "function", "function": {"name": "..."}}'
    )


ToolChoice = Annotated[Literal["none", "auto", "required"] | ToolChoiceObject, BeforeValidator(_tool_choice)]


def _function_call(value: Any) -> Any:
    if value is None or value in ("none", "auto"):
        return value
    if isinstance(value, dict):
        try:
            return NamedFunction.model_validate(value)
        except ValidationError:
            pass
    raise ValueError('must be "none", "auto" or {"name": "..."}')


# The deprecated `function_call`: tool_choice's "none", "auto" or a named function, as OpenAI wrote it.
FunctionCallChoice = Annotated[Literal["none", "auto"] | NamedFunction, BeforeValidator(_function_call)]


def _bad(message: str, param: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_request_error", param=param)


@dataclass(frozen=True)
class ToolSpec:
    tools: tuple[dict[str, Any], ...]  # as the template and the guide see them
    choice: str  # "auto", "required" or "function" (then `name`)
    name: str | None = None
    parallel: bool = True
    legacy: bool = False  # asked with functions/function_call: the reply's call is its `function_call`

    @property
    def guided(self) -> bool:
        return self.choice != "auto"

    def template_tools(self) -> list[dict[str, Any]]:
        return list(self.tools)

    def call_schema(self) -> dict[str, Any]:
        """One call of any of the tools: `{"name": …, "arguments": …}` with that tool's parameters."""
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": t["function"]["name"]}, "arguments": _parameters(t)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.tools
        ]
        return calls[0] if len(calls) == 1 else {"anyOf": calls}

    def guide_schema(self) -> dict[str, Any]:
        """The JSON schema the reply must match for `required` or a named function."""
        if self.choice == "function":
            return _parameters(next(t for t in self.tools if t["function"]["name"] == self.name))
        call = self.call_schema()
        if not self.parallel:
            return call
        return {"type": "array", "items": call, "minItems": 1}

    def guide_json(self) -> str:
        return json.dumps(self.guide_schema(), ensure_ascii=False)

    def tagged_calls_guide_json(self) -> str:
        """`auto` with the tools in the prompt (Hermes' format, tritonlm.text.chat_format): an
        xgrammar structural tag. The text is free until `<tool_call>`; then a valid call and
        `</tool_call>` must follow (only one such block when `parallel_tool_calls` is false)."""
        tag = {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": [CALL_OPEN],
                "tags": [
                    {
                        "type": "tag",
                        "begin": CALL_OPEN + "\n",
                        # Bounded whitespace: a model may otherwise loop on spaces inside a call.
                        "content": {
                            "type": "json_schema",
                            "json_schema": self.call_schema(),
                            "max_whitespace_cnt": 1,
                        },
                        "end": "\n" + CALL_CLOSE,
                    }
                ],
                "stop_after_first": not self.parallel,
            },
        }
        return json.dumps(tag, ensure_ascii=False)


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def tool_spec(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel: bool | None,
    names: tuple[str, str] = ("tools", "tool_choice"),
) -> ToolSpec | None:
    """The request's tool settings, or None when the reply is plain text (no tools, or `none`).
    `names`: the request's names of the tools and the choice, for errors."""
    tools_param, choice_param = names
    if tools is not None and len(tools) > MAX_TOOLS:
        raise _bad(f"at most {MAX_TOOLS} functions, got {len(tools)}", tools_param)
    names_given = [t.function.name for t in tools or []]
    if len(set(names_given)) != len(names_given):
        raise _bad("function names must be unique", tools_param)
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    if not tools:
        raise _bad(f'needs {tools_param} (only "none" without them)', choice_param)
    as_dicts = tuple(t.model_dump(exclude_none=True) for t in tools)
    if isinstance(choice, ToolChoiceObject):
        if choice.function.name not in names_given:
            raise _bad(
                f"names the function {choice.function.name!r}, which is not in {tools_param} "
                f"({', '.join(names_given)})",
                choice_param,
            )
        return ToolSpec(as_dicts, "function", choice.function.name, parallel is not False)
    return ToolSpec(as_dicts, choice, None, parallel is not False)


def legacy_tool_spec(
    functions: list[FunctionDefinition] | None, function_call: FunctionCallChoice | None
) -> ToolSpec | None:
    """The deprecated `functions` / `function_call` as tools and tool_choice, one call per reply
    (a legacy reply has one `function_call`)."""
    tools = None if functions is None else [Tool(type="function", function=f) for f in functions]
    choice: ToolChoice | None = function_call  # type: ignore[assignment]
    if isinstance(function_call, NamedFunction):
        choice = ToolChoiceObject(type="function", function=function_call)
    spec = tool_spec(tools, choice, False, names=("functions", "function_call"))
    return None if spec is None else replace(spec, legacy=True)
