"""Request bodies of the OpenAI APIs: `POST /v1/chat/completions` and
`POST /v1/completions`, and the validators and message types other APIs built on them reuse.

Every documented field with its type, range and default; JSON types are strict (no "true" strings,
no 1.5 for an integer, no true for a number); `null` means "not given" for every optional field (the
APIs' own documented examples send `"seed": null`, `"n": null` …); unknown fields are rejected, so no
parameter is silently ignored. Rules that tie fields together are checked by `to_job`, which turns a
request into the API-neutral `frontend.engine_client.request.Job` and raises a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator

from frontend.chat_tools.reasoning import EFFORTS, effort_kwargs
from frontend.chat_tools.tools import (
    FunctionCallChoice,
    FunctionDefinition,
    Tool,
    ToolChoice,
    ToolSpec,
    legacy_tool_spec,
    tool_spec,
)
from frontend.engine_client import guides
from frontend.engine_client.request import Guide, Job
from frontend.errors import APIError
from frontend.field_rules import (
    MAX_INT32,
    MAX_UINT64,
    Priority,
    bounded_text,
    json_boolean,
    number,
    total_chars,
)
from frontend.media.parts import CHAT_PARTS, TextPart, parts_validator
from frontend.openai_api import prompt_embeds
from frontend.openai_api.fields import (
    Audio,
    Modalities,
    Moderation,
    OpenAIFields,
    Prediction,
    PromptCacheSetting,
    Suffix,
    Verbosity,
    WebSearchOptions,
)

MAX_PROMPT_CHARS = 4 * 1024 * 1024  # "0 KB < characters <= 4 MB"
MAX_STOP_CHARS = 32 * 1024  # OpenAI completions: a stop string, or all of a list, at most 32768 characters
MAX_SEQUENCES = 128  # n and best_of: [1, 128]
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
# Strict JSON types, unknown fields rejected: the body config of every request schema.
STRICT_BODY = ConfigDict(extra="forbid", strict=True)


def bad_request(message: str, param: str) -> APIError:
    return APIError(400, f"{param}: {message}", "invalid_request_error", param=param)


def parse_body(model: type[BaseModel], body: Any) -> Any:
    """Validate a body read as plain JSON (routes that pick the schema from the body's fields);
    errors are reported exactly like FastAPI's own body validation."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None


# ---------------------------------------------------------------------------------------------
# Field validators. Each raises ValueError with what the field allows; the error handler adds the
# field's path.


def _optional_flag(value: Any) -> Any:
    return json_boolean(value, optional=True)


Flag = Annotated[bool | None, BeforeValidator(_optional_flag)]


def _stop(value: Any) -> list[str] | None:
    """A string or a list of strings (OpenAI completions' limits); a list, or None when empty."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise ValueError("must be a non-empty string or a list of non-empty strings")
    total_chars(value, MAX_STOP_CHARS)
    return value or None


def _token_ids(value: Any) -> list[int] | None:
    if value is None:
        return None
    ok = isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_INT32 for i in value
    )
    if not ok:
        raise ValueError(f"must be a list of token ids (integers in [0, {MAX_INT32}])")
    return value


def _prompt_text(value: Any) -> str:
    return bounded_text(value, MAX_PROMPT_CHARS)


Stop = Annotated[list[str] | None, BeforeValidator(_stop, json_schema_input_type=str | list[str] | None)]
TokenIds = Annotated[list[int] | None, BeforeValidator(_token_ids)]
Penalty = Annotated[float | None, number(-2.0, 2.0)]
Seed = Annotated[int | None, number(0, MAX_UINT64, integer=True)]
MaxTokens = Annotated[int | None, number(0, MAX_INT32, integer=True, low_open=True)]
Count = Annotated[int | None, number(1, MAX_SEQUENCES, integer=True)]
TopP = Annotated[float | None, number(1e-6, 1.0, low_open=True)]


# ---------------------------------------------------------------------------------------------
# Chat messages (OpenAI chat completions).


class FunctionCall(BaseModel):
    model_config = STRICT_BODY
    name: str
    arguments: str | dict[str, Any]  # OpenAI sends a JSON string; an object is taken as is


class ToolCall(BaseModel):
    model_config = STRICT_BODY
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = STRICT_BODY
    role: Literal["system", "user", "assistant", "tool", "function"]  # function: deprecated, a tool's
    # Media parts (image_url, video_url, audio_url, input_audio: frontend.media.parts) are checked
    # against the served model and fetched by the route.
    content: Annotated[str | list[Any] | None, parts_validator(CHAT_PARTS, "a string", nullable=True)] = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # The deprecated function calling: an assistant's one call, and the function a `function`
    # message answers for (chat_messages turns both into tool calling).
    function_call: FunctionCall | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _roles(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message has tool calls")
        if self.function_call and self.role != "assistant":
            raise ValueError("function_call: only an assistant message has one")
        if self.tool_calls and self.function_call:
            raise ValueError("function_call: give tool_calls or the deprecated function_call, not both")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: required when role is tool")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError("tool_call_id: only a tool message has one")
        if (self.role == "function") != (self.name is not None):
            raise ValueError("name: required when role is function (the function's), and only then")
        if self.content is None and not (self.tool_calls or self.function_call):
            raise ValueError("content: required (only an assistant message with tool_calls may omit it)")
        return self

    def chars(self) -> int:
        if isinstance(self.content, list):
            return sum(len(p.text) for p in self.content if isinstance(p, TextPart))
        return len(self.content or "")


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    if not messages:
        raise bad_request("must have at least one message", "messages")
    if sum(m.chars() for m in messages) > MAX_PROMPT_CHARS:
        raise bad_request(f"must have at most {MAX_PROMPT_CHARS} characters of content in all", "messages")
    return _as_tool_calling([m.model_dump(exclude_none=True) for m in messages])


def _as_tool_calling(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The deprecated function-calling turns as the tool-calling ones templates render: an
    assistant's `function_call` its one tool call (id `call_<message index>`), a `function` message
    the tool message answering the last call of that function."""
    calls: dict[str, str] = {}  # function name -> its last call's id
    out = []
    for i, message in enumerate(messages):
        if "function_call" in message:
            call = message.pop("function_call")
            calls[call["name"]] = f"call_{i}"
            message["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": call}]
        elif message["role"] == "function":
            message = {**message, "role": "tool", "tool_call_id": calls.get(message["name"], message["name"])}
        out.append(message)
    return out


class StreamOptions(BaseModel):
    model_config = STRICT_BODY
    include_usage: Flag = None


# ---------------------------------------------------------------------------------------------
# Shared rules between fields.


def _sequences(job: Job, n: int | None, best_of: int | None, use_beam_search: bool, stream: bool) -> None:
    """n, best_of and beam search (both OpenAI APIs): best_of >= n; more than one sequence needs
    temperature > 0; streaming needs best_of == n (nothing can be ranked before the end)."""
    job.n = n or 1
    job.beam_search = use_beam_search
    if use_beam_search:  # "best_of is not checked when use_beam_search is true"
        job.best_of = max(job.n, best_of or 1)
        for param, value in (("stop", job.stop), ("stop_token_ids", job.stop_token_ids)):
            if value:
                raise bad_request("cannot be used with use_beam_search", param)
        # Beam search follows the log probabilities (at temperature 1); it does not sample.
        sampling = (
            ("temperature", job.temperature not in (None, 0.0, 1.0)),
            ("top_p", job.top_p is not None and job.top_p < 1.0),
            ("top_k", bool(job.top_k)),
        )
        for param, changed in sampling:
            if changed:
                raise bad_request("beam search does not sample: leave it unset (temperature 1 or 0)", param)
        return
    job.best_of = best_of or job.n
    if job.best_of < job.n:
        raise bad_request(f"must be >= n ({job.n}), got {job.best_of}", "best_of")
    for param, value in (("n", job.n), ("best_of", job.best_of)):
        if value > 1 and job.temperature == 0:
            raise bad_request(f"{value} sequences need temperature > 0 (temperature 0 is greedy)", param)
    if stream and job.best_of != job.n:
        raise bad_request("must equal n when stream is true", "best_of")


def _max_tokens(job: Job, min_tokens: int | None, param: str) -> None:
    if min_tokens:
        job.min_tokens = min_tokens
        if job.max_tokens is not None and min_tokens > job.max_tokens:
            raise bad_request(f"must be <= {param} ({job.max_tokens}), got {min_tokens}", "min_tokens")


def _stream_usage(stream: bool, options: StreamOptions | None) -> bool:
    if options is None:
        return True  # both OpenAI APIs: the last chunk carries the usage
    if not stream:
        raise bad_request("only allowed when stream is true", "stream_options")
    return options.include_usage is not False


def _sampling(request: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    """The Job fields chat and completions requests share, with the documented defaults (the
    sampling parameters a request leaves out are the served model's defaults: Job.sampling)."""
    return {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": _top_k(request.top_k),
        "seed": request.seed,
        "presence_penalty": request.presence_penalty or 0.0,
        "frequency_penalty": request.frequency_penalty or 0.0,
        "repetition_penalty": request.repetition_penalty,
        "stop": request.stop or [],
        "stop_token_ids": request.stop_token_ids or [],
        "include_stop_str_in_output": bool(request.include_stop_str_in_output),
        "skip_special_tokens": request.skip_special_tokens is not False,
        "ignore_eos": bool(request.ignore_eos),
        "stream": bool(request.stream),
        "stream_usage": _stream_usage(bool(request.stream), request.stream_options),
        "priority": request.priority or 0,
        "logit_bias": request.logit_bias,
    }


def _top_k(value: int | None) -> int | None:
    return None if value is None else max(value, 0)  # -1 (and 0) mean "no limit"; engine: 0


# ---------------------------------------------------------------------------------------------
# POST /v1/chat/completions (OpenAI chat completions)


class ChatCompletionRequest(OpenAIFields):
    model_config = STRICT_BODY

    model: str
    messages: list[ChatMessage]
    stream: Flag = None
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    repetition_penalty: Annotated[float | None, number(0.0, 2.0, low_open=True)] = None
    temperature: Annotated[float | None, number(0.0, 2.0)] = None
    top_p: TopP = None
    # Documented as (0, 2147483647]; the API's own example sends 0, so 0 and -1 mean "no limit".
    top_k: Annotated[int | None, number(0, MAX_INT32, integer=True, also=(-1,))] = None
    seed: Seed = None
    stop: Stop = None
    stop_token_ids: TokenIds = None
    include_stop_str_in_output: Flag = None
    skip_special_tokens: Flag = None
    ignore_eos: Flag = None
    priority: Priority = None  # vLLM's: lower runs first
    max_tokens: MaxTokens = None
    max_completion_tokens: MaxTokens = None  # OpenAI's newer name for max_tokens
    min_tokens: Annotated[int | None, number(0, MAX_INT32, integer=True)] = None
    use_beam_search: Flag = None
    best_of: Count = None
    n: Count = None
    logprobs: Flag = None
    top_logprobs: Annotated[int | None, number(0, MAX_TOP_LOGPROBS, integer=True)] = None
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None  # structured output (frontend.engine_client.guides)
    structured_outputs: dict[str, Any] | None = None  # vLLM's
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Flag = None
    functions: list[FunctionDefinition] | None = None  # deprecated: tools (a reply's call is function_call)
    function_call: FunctionCallChoice | None = None  # deprecated: tool_choice
    # The template's thinking switch (frontend.chat_tools.reasoning.effort_kwargs).
    reasoning_effort: Literal[EFFORTS] | None = None  # type: ignore[valid-type]
    modalities: Modalities = None  # only ["text"]
    # OpenAI's, not served: each a 400 that says what to send instead.
    verbosity: Verbosity = None
    prediction: Prediction = None
    audio: Audio = None
    web_search_options: WebSearchOptions = None
    moderation: Moderation = None
    prompt_cache_retention: PromptCacheSetting = None
    prompt_cache_options: PromptCacheSetting = None

    def to_job(self, reasoning_parser: str = "think") -> Job:
        """The request as a Job; `reasoning_parser`: the served model's (`none`: it does not reason)."""
        max_tokens = self.max_completion_tokens or self.max_tokens
        if self.max_tokens and self.max_completion_tokens and self.max_tokens != self.max_completion_tokens:
            raise bad_request("must equal max_tokens when both are given", "max_completion_tokens")
        job = Job(
            messages=chat_messages(self.messages),
            chat_template_kwargs=self._template_kwargs(reasoning_parser),
            tools=self._tools(),
            max_tokens=max_tokens,
            **_sampling(self),
            prompt_param="messages",
            max_tokens_param="max_completion_tokens" if self.max_completion_tokens else "max_tokens",
        )
        _max_tokens(job, self.min_tokens, job.max_tokens_param)
        _guide(job, self.response_format, self.structured_outputs)
        _chat_logprobs(job, self.logprobs, self.top_logprobs)
        _sequences(job, self.n, self.best_of, bool(self.use_beam_search), job.stream)
        return job

    def _tools(self) -> ToolSpec | None:
        """tools / tool_choice, or the deprecated functions / function_call: not both kinds."""
        for legacy, current in (("functions", "tools"), ("function_call", "tool_choice")):
            if getattr(self, legacy) is not None and getattr(self, current) is not None:
                raise bad_request(f"give {current} or the deprecated {legacy}, not both", legacy)
        if self.functions is not None or self.function_call is not None:
            if self.parallel_tool_calls:
                raise bad_request("only with tools (functions make one call a reply)", "parallel_tool_calls")
            return legacy_tool_spec(self.functions, self.function_call)
        return tool_spec(self.tools, self.tool_choice, self.parallel_tool_calls)

    def _template_kwargs(self, reasoning_parser: str) -> dict[str, Any] | None:
        """chat_template_kwargs with reasoning_effort's thinking switch; a contradiction is a 400."""
        kwargs = dict(self.chat_template_kwargs or {})
        for name, value in effort_kwargs(self.reasoning_effort, reasoning_parser).items():
            if kwargs.setdefault(name, value) != value:
                raise bad_request(
                    f"{self.reasoning_effort!r} sets {name} {str(value).lower()}, but chat_template_kwargs "
                    f"sets it {str(kwargs[name]).lower()}; give one of them",
                    "reasoning_effort",
                )
        return kwargs if kwargs or self.chat_template_kwargs is not None else None


def _guide(job: Job, response_format: Any, structured_outputs: Any) -> None:
    """Structured output: OpenAI's response_format or vLLM's structured_outputs, not both; or the
    call that tool_choice required / a named function asks for."""
    if response_format is not None and structured_outputs is not None:
        raise bad_request("give response_format or structured_outputs, not both", "structured_outputs")
    job.guide = guides.response_format(response_format) or guides.structured_outputs(structured_outputs)
    job.guide_param = "structured_outputs" if structured_outputs is not None else "response_format"
    tools_guide(job)


def tools_guide(job: Job) -> None:
    """tool_choice required or a named function: the grammar makes the reply that call."""
    if job.tools is None or not job.tools.guided:
        return
    if job.guide is not None:
        raise bad_request(f"cannot be combined with tool_choice {job.tools.choice!r}", job.guide_param)
    job.guide, job.guide_param = Guide("json_schema", job.tools.guide_json()), "tools"


def guide_calls_in_prompt(job: Job) -> None:
    """tool_choice auto when the chat template knows no tools (they are written into the prompt):
    the reply stays free text, but each `<tool_call>` block it opens must be a valid call. An
    explicit response_format / structured_outputs wins (the model then answers in that format)."""
    if job.tools is None or job.tools.guided or job.guide is not None:
        return
    job.guide, job.guide_param = Guide("structural_tag", job.tools.tagged_calls_guide_json()), "tools"


def _chat_logprobs(job: Job, logprobs: bool | None, top_logprobs: int | None) -> None:
    """Seed 001: a top_logprobs value without logprobs turns logprobs on; logprobs false with
    alternatives asked for is a contradiction."""
    if logprobs is False and top_logprobs:
        raise bad_request("needs logprobs true", "top_logprobs")
    if logprobs or top_logprobs is not None:
        job.logprobs = top_logprobs or 0


# ---------------------------------------------------------------------------------------------
# POST /v1/completions (OpenAI completions)


class CompletionRequest(OpenAIFields):
    model_config = STRICT_BODY

    model: str
    # Optional only with prompt_embeds (vLLM's), whose rows then come before the prompt's tokens.
    prompt: Annotated[str | None, BeforeValidator(_prompt_text, json_schema_input_type=str)] = None
    prompt_embeds: str | list[str] | None = None  # base64 torch.save'd [P, hidden], or one per prompt
    use_beam_search: Flag = None
    best_of: Count = None
    n: Count = None
    logprobs: Annotated[int | None, number(0, MAX_COMPLETION_LOGPROBS, integer=True)] = None
    max_tokens: MaxTokens = None
    min_tokens: Annotated[int | None, number(0, MAX_INT32, integer=True)] = None
    seed: Annotated[int | None, number(0, MAX_UINT64, integer=True, low_open=True)] = None
    stop: Stop = None
    stream: Flag = None
    stream_options: StreamOptions | None = None
    repetition_penalty: Annotated[float | None, number(0.0, 2.0, low_open=True)] = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    temperature: Annotated[float | None, number(0.0)] = None  # 0: greedy
    top_p: TopP = None
    top_k: Annotated[int | None, number(0, MAX_INT32, integer=True, low_open=True, also=(-1,))] = None
    stop_token_ids: TokenIds = None
    include_stop_str_in_output: Flag = None
    ignore_eos: Flag = None
    skip_special_tokens: Flag = None
    priority: Priority = None  # vLLM's: lower runs first
    echo: Flag = None
    response_format: dict[str, Any] | None = None  # structured output (frontend.engine_client.guides)
    structured_outputs: dict[str, Any] | None = None  # vLLM's
    suffix: Suffix = None  # OpenAI's, not served

    def to_jobs(self) -> list[Job]:
        """One job, or one per prompt_embeds tensor (each with the prompt after it, if given)."""
        if self.prompt is None and self.prompt_embeds is None:
            raise bad_request("is required (or prompt_embeds)", "prompt")
        tables: list[Any] = [None] if self.prompt_embeds is None else _prompt_embeds(self.prompt_embeds)
        if tables[0] is not None and self.echo:
            raise bad_request("not with prompt_embeds (embeddings have no text to echo)", "echo")
        return [self._job(table) for table in tables]

    def _job(self, table: Any) -> Job:
        job = Job(
            prompt=self.prompt,
            max_tokens=self.max_tokens,
            **_sampling(self),
            logprobs=self.logprobs,
            echo=bool(self.echo),
            prompt_embeds=table,
        )
        _max_tokens(job, self.min_tokens, "max_tokens")
        _guide(job, self.response_format, self.structured_outputs)
        _sequences(job, self.n, self.best_of, bool(self.use_beam_search), job.stream)
        return job


def _prompt_embeds(value: str | list[str]) -> list[Any]:
    try:
        return prompt_embeds.decode_all(value)
    except prompt_embeds.BadEmbeds as error:
        raise bad_request(str(error), prompt_embeds.PARAM) from None
