"""The body of the TGI-compatible `POST /`: every documented field with its type, range
and default. Types are strict JSON types (no "true" strings, no 1.5 for an integer, no true for a
number), unknown fields are rejected, and each error names the field and what it allows.

`None` means "not given" for every optional number, so the route can tell a default from a choice
(TGI's sampling decision depends on which parameters were given).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from frontend.field_rules import MAX_INT32, MAX_UINT64, Priority, bounded_text, json_boolean, number
from frontend.media.parts import INPUT_PARTS, parts_validator

MAX_INPUT_CHARS = 4 * 1024 * 1024
MAX_STOP_ITEMS = 1024
MAX_STOP_CHARS = 1024
MAX_STOP_TOTAL = 32_768
MAX_ADAPTER_CHARS = 256
DEFAULT_MAX_NEW_TOKENS = 20
ADAPTER_NONE = "None"  # TGI's spelling of "the base model, no adapter"
_ADAPTER_CHARS = re.compile(r"[A-Za-z0-9./_-]*")


Flag = Annotated[bool, BeforeValidator(json_boolean)]


def _number(low: float, high: float | None = None, *, integer: bool = False, high_open: bool = False) -> Any:
    """A validator for a JSON number in (low, high], or (low, high) with high_open, or > low."""
    return number(low, high, integer=integer, low_open=True, high_open=high_open, says_value=False)


def _inputs(value: Any) -> Any:
    """A prompt string, or a non-empty list of content parts; the parts are checked by their models
    (frontend.media.parts), their media against the served model by the route."""
    if isinstance(value, list):
        if not value:
            raise ValueError("must be a non-empty string or a non-empty list of content parts")
        texts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") == "text"]
        if sum(len(t) for t in texts if isinstance(t, str)) > MAX_INPUT_CHARS:
            raise ValueError(f"must have at most {MAX_INPUT_CHARS} characters of text in all")
        return value
    return bounded_text(value, MAX_INPUT_CHARS)


def _stop(value: Any) -> list[str] | None:
    """A string or a list of strings; returned as a list, or None when empty."""
    item = f"a string of 1 to {MAX_STOP_CHARS} characters"
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list):
        raise ValueError(f"must be {item} or a list of such strings")
    if len(value) > MAX_STOP_ITEMS:
        raise ValueError(f"must have at most {MAX_STOP_ITEMS} entries")
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not 0 < len(entry) <= MAX_STOP_CHARS:
            raise ValueError(f"entry {i} must be {item}")
    if sum(len(s) for s in value) > MAX_STOP_TOTAL:
        raise ValueError(f"entries must total at most {MAX_STOP_TOTAL} characters")
    return value or None


def _adapter(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_ADAPTER_CHARS or not _ADAPTER_CHARS.fullmatch(value):
        raise ValueError(
            f"must be a string of at most {MAX_ADAPTER_CHARS} characters from A-Z a-z 0-9 . / _ -"
        )
    return value  # whether the server has it: the route checks (frontend.tgi.routes.plan)


_Int32 = _number(0, MAX_INT32, integer=True)


class GenerateParameters(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    decoder_input_details: Flag = False
    details: Flag = False
    do_sample: Flag = False  # false or absent: the other sampling parameters decide
    max_new_tokens: Annotated[int | None, _Int32] = DEFAULT_MAX_NEW_TOKENS
    repetition_penalty: Annotated[float | None, _number(0.0)] = None
    return_full_text: Flag = False
    seed: Annotated[int | None, _number(0, MAX_UINT64, integer=True)] = None
    temperature: Annotated[float | None, _number(1e-6)] = None
    top_k: Annotated[int | None, _Int32] = None
    top_p: Annotated[float | None, _number(1e-6, 1.0, high_open=True)] = None
    truncate: Annotated[int | None, _Int32] = None
    typical_p: Annotated[float | None, _number(0.0, 1.0)] = None
    watermark: Flag = False
    stop: Annotated[
        list[str] | None, BeforeValidator(_stop, json_schema_input_type=str | list[str] | None)
    ] = None
    adapter_id: Annotated[str | None, BeforeValidator(_adapter)] = ADAPTER_NONE
    grammar: dict[str, Any] | None = None  # {type: json | regex, value} (frontend.engine_client.guides)
    priority: Priority = None  # vLLM's (an extension): lower runs first


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # A prompt, or (multimodal models) a list of text, image_url, video_url and audio_url parts.
    inputs: Annotated[
        str | list[Any], parts_validator(INPUT_PARTS, "a non-empty string"), BeforeValidator(_inputs)
    ]
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)
    stream: Flag = False

    @model_validator(mode="after")
    def _no_prefill_details_when_streaming(self) -> GenerateRequest:
        if self.stream and self.parameters.decoder_input_details:
            raise ValueError("parameters.decoder_input_details must be false when stream is true")
        return self

    def is_sampling(self) -> bool:
        """TGI's rule: sample when asked to, or when any parameter that only matters for sampling
        is given with a value that changes the distribution."""
        p = self.parameters
        return bool(
            p.do_sample
            or (p.temperature is not None and p.temperature != 1.0)
            or p.top_k is not None
            or (p.top_p is not None and p.top_p < 1.0)
            or (p.typical_p is not None and p.typical_p < 1.0)
        )
