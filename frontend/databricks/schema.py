"""Request bodies of Databricks' chat and completions tasks (Databricks model serving):
`POST /serving-endpoints/{name}/invocations`, and `POST /serving-endpoints/chat/completions` |
`/completions` with `model` naming the endpoint. The chat messages, tools and field validators are
OpenAI's (frontend.openai_api.schema); the ranges, defaults and rules here are Databricks' own.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator

from frontend.chat_tools.tools import Tool, ToolChoice, tool_spec
from frontend.engine_client import guides
from frontend.engine_client.request import Job
from frontend.field_rules import MAX_INT32, Priority, number, total_chars
from frontend.openai_api.schema import (
    MAX_PROMPT_CHARS,
    MAX_SEQUENCES,
    MAX_TOP_LOGPROBS,
    STRICT_BODY,
    ChatMessage,
    Flag,
    Stop,
    bad_request,
    chat_messages,
    tools_guide,
)


def _prompts(value: Any) -> list[str]:
    """A string or a non-empty list of strings, each answered in the same response."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(p, str) and p for p in items):
        raise ValueError("must be a non-empty string or a non-empty list of non-empty strings")
    total_chars(items, MAX_PROMPT_CHARS)
    return items


DatabricksMaxTokens = Annotated[int | None, number(0, MAX_INT32, integer=True, low_open=True)]
DatabricksTemperature = Annotated[float | None, number(0.0, 2.0)]
DatabricksTopP = Annotated[float | None, number(0.0, 1.0, low_open=True)]
DatabricksTopK = Annotated[int | None, number(0, MAX_INT32, integer=True, low_open=True)]


def _databricks_sampling(request: DatabricksChatRequest | DatabricksCompletionRequest) -> dict[str, Any]:
    """The Job fields both Databricks tasks share, with the documented defaults."""
    return {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,  # None: the model's default (Job.sampling)
        "top_p": request.top_p,
        "top_k": request.top_k,
        "stop": request.stop or [],
        "stream": bool(request.stream),
        "priority": request.priority or 0,
    }


class DatabricksChatRequest(BaseModel):
    model_config = STRICT_BODY

    messages: list[ChatMessage]
    max_tokens: DatabricksMaxTokens = None  # null: no limit but the model's context
    stream: Flag = None
    temperature: DatabricksTemperature = None
    top_p: DatabricksTopP = None
    top_k: DatabricksTopK = None
    stop: Stop = None
    priority: Priority = None  # vLLM's (an extension here): lower runs first
    n: Annotated[int | None, number(1, MAX_SEQUENCES, integer=True)] = None
    tool_choice: ToolChoice | None = None
    tools: list[Tool] | None = None
    parallel_tool_calls: Flag = None
    response_format: dict[str, Any] | None = None  # Databricks: text, json_object, json_schema
    logprobs: Flag = None
    top_logprobs: Annotated[int | None, number(0, MAX_TOP_LOGPROBS, integer=True)] = None

    def to_job(self) -> Job:
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("needs logprobs true", "top_logprobs")  # Databricks' rule
        job = Job(
            messages=chat_messages(self.messages),
            tools=tool_spec(self.tools, self.tool_choice, self.parallel_tool_calls),
            **_databricks_sampling(self),
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
            prompt_param="messages",
        )
        job.n = job.best_of = self.n or 1  # Databricks has no n > 1 temperature rule
        job.guide = guides.response_format(self.response_format, name_required=True)  # Databricks
        tools_guide(job)
        return job


class DatabricksCompletionRequest(BaseModel):
    model_config = STRICT_BODY

    prompt: Annotated[list[str], BeforeValidator(_prompts, json_schema_input_type=str | list[str])]
    max_tokens: DatabricksMaxTokens = None
    stream: Flag = None
    temperature: DatabricksTemperature = None
    top_p: DatabricksTopP = None
    top_k: DatabricksTopK = None
    error_behavior: Literal["truncate", "error"] | None = None
    n: Annotated[int | None, number(1, MAX_SEQUENCES, integer=True)] = None
    stop: Stop = None
    priority: Priority = None  # vLLM's (an extension here): lower runs first
    suffix: str | None = None
    echo: Flag = None
    # Completion prompts are never templated here, so the prompt always goes to the model as is.
    use_raw_prompt: Flag = None

    def to_jobs(self) -> list[Job]:
        """One job per prompt; their choices are answered together."""
        jobs = []
        for prompt in self.prompt:
            job = Job(
                prompt=prompt,
                **_databricks_sampling(self),
                echo=bool(self.echo),
                suffix=self.suffix or "",
                truncate_to_fit=self.error_behavior == "truncate",
            )
            job.n = job.best_of = self.n or 1
            jobs.append(job)
        return jobs


class NamedDatabricksChatRequest(DatabricksChatRequest):
    """`POST /serving-endpoints/chat/completions`: the OpenAI SDK's path, `model` names the endpoint."""

    model: str


class NamedDatabricksCompletionRequest(DatabricksCompletionRequest):
    model: str
