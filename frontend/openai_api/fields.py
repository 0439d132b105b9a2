"""OpenAI's documented request fields beyond the prompt and sampling ones, for chat completions and
completions: `logit_bias`; the fields that change nothing in what is generated (OpenAI's account,
billing and caching hints, accepted so that SDKs and agent frameworks can send them; docs/http-apis.md
lists them); and the fields this server cannot honour, each refused with what to send instead.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, PlainValidator

from frontend.errors import APIError, invalid_request
from frontend.field_rules import Metadata, refused

MAX_LOGIT_BIAS = 100.0  # OpenAI's: a bias in [-100, 100]


def _logit_bias(value: Any) -> dict[int, float] | None:
    """`{"token id": bias}`: keys are token ids written as JSON strings (as OpenAI's are), biases
    numbers in [-100, 100]. The ids are checked against the model's vocabulary by the route."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError('must be an object of token ids to biases, e.g. {"50256": -100}')
    biases = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ValueError(f"keys must be token ids written as strings of digits, got {key!r}")
        number = isinstance(bias, (int, float)) and not isinstance(bias, bool)
        if not number or not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
            raise ValueError(
                f"biases must be numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias!r} for {key}"
            )
        biases[int(key)] = float(bias)
    return biases or None


LogitBias = Annotated[
    dict[int, float] | None, BeforeValidator(_logit_bias, json_schema_input_type=dict[str, float] | None)
]


def embedding_bias(biases: dict[int, float], vocab_size: int | None) -> np.ndarray:
    """`logit_bias` as the engine's embedding_bias, a [vocab_size] FP32 row added to the logits
    before the penalties and temperature (tritonlm.sampling.logits_processors), as OpenAI adds it
    "prior to sampling"; a token id outside the vocabulary is a 400."""
    if vocab_size is None:
        raise _bad_bias("the model's config.json names no vocab_size to check the token ids against")
    if outside := [i for i in biases if i >= vocab_size]:
        raise _bad_bias(
            f"token ids must be in [0, {vocab_size - 1}] (the model's vocabulary), got {outside[0]}"
        )
    row = np.zeros(vocab_size, dtype=np.float32)
    row[list(biases)] = list(biases.values())
    return row


def _bad_bias(message: str) -> APIError:
    return invalid_request(400, f"logit_bias: {message}", "logit_bias")


def _store(value: Any) -> Any:
    if value is None or value is False:
        return value
    if value is True:
        raise ValueError(
            "nothing is stored by this server (no completion can be retrieved later); "
            "send false or leave it out"
        )
    raise ValueError("must be a JSON boolean: false (nothing is stored)")


class ServiceHints(BaseModel):
    """Accepted, no effect on generation: who the end user is, the billing tier and the caching hint
    of OpenAI's service (chat completions, completions and the Responses API all take them). The
    prefix cache here is automatic, whatever the key."""

    user: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class OpenAIFields(ServiceHints):
    """Fields both OpenAI generation requests take besides prompt and sampling."""

    # Added to the token's logit before sampling (the engine's embedding_bias): -100 bans a token in
    # practice, +100 all but forces it.
    logit_bias: LogitBias = None
    metadata: Metadata = None  # labels: accepted, no effect
    store: Annotated[bool | None, PlainValidator(_store, json_schema_input_type=Literal[False] | None)] = None


def _modalities(value: Any) -> Any:
    if value is None or value == ["text"]:
        return value
    raise ValueError('only ["text"]: this server writes text (no audio output)')


# Chat completions' documented fields that are refused (or allowed one value), with what to send instead.
Modalities = Annotated[list[Literal["text"]] | None, BeforeValidator(_modalities)]
Verbosity = refused(
    "leave it out (ask for a shorter or longer answer in the messages, or set max_completion_tokens)"
)
Prediction = refused(
    "leave it out (predicted outputs are not served; the engine's speculative decoding is a server setting)"
)
Audio = refused('leave it out (this server writes text only: modalities ["text"])')
WebSearchOptions = refused("leave it out (give the model a search function in tools instead)")
Moderation = refused("leave it out (no moderation runs here)")
PromptCacheSetting = refused(
    "leave it out (the prefix cache is automatic and its lifetime the server's; prompt_cache_key is accepted)"
)
# Completions' `suffix` (fill-in-the-middle).
Suffix = refused("leave it out (no fill-in-the-middle: the completion follows the prompt)")
