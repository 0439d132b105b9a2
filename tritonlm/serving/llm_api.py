"""TensorRT-LLM's LLM-API Triton model (`tensorrt_llm`) over our ensemble: its request tensors as the
ensemble's, and the ensemble's responses as its outputs. Plain numpy in and out (no Triton here):
`ensemble_bls` runs the call. The names, types and defaults are contract.LLM_API_INPUTS/OUTPUTS.

Meanings kept from TensorRT-LLM: absent sampling settings are the runtime's defaults (greedy unless
sampling_param_top_k or sampling_param_top_p ask to sample), sampling_param_max_tokens defaults to 32,
sampling_param_exclude_input_from_output to false (a response not streamed starts with the prompt),
and every response's text_output is the whole text so far (CompletionOutput.text), streamed or not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tritonlm import contract
from tritonlm.errors import InvalidRequest
from tritonlm.request_tensors import RequestTensors

INPUTS: tuple[contract.Tensor, ...] = tuple(t for t, _ in contract.LLM_API_INPUTS)
_TARGET = {t.name: target for t, target in contract.LLM_API_INPUTS if target}
_ENSEMBLE = {t.name: t for t, _ in contract.ENSEMBLE_INPUTS}
_OUTPUT_TYPES = {t.name: contract.NUMPY_DTYPES[t.dtype] for t in contract.LLM_API_OUTPUTS}

# Ours → the LLM API's: what a finished sequence reports ("None" until then, as str(None) reads).
FINISH_REASONS = {"length": "length", "end_id": "stop", "stop_words": "stop", "cancelled": "cancelled"}
NOT_YET = "None"

# Inputs refused whatever their value, with what to send instead.
_REFUSED = {
    "lora_id": "adapters are not loaded per request here: name one loaded at start-up "
    "(lora_modules) with lora_name",
    "image_url": "media are not fetched by tensorrt_llm: send the file's bytes as the ensemble's "
    "`media` input, or an image_url through the HTTP frontend's chat API",
}
_REFUSED["lora_path"] = _REFUSED["lora_ckpt_source"] = _REFUSED["lora_id"]

# Perf metrics the ensemble reports under the same name.
_SAME_METRICS = (
    "kv_cache_alloc_new_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)


# Call's switches: the input that sets each.
_SWITCHES = {
    "finish_reason": "return_finish_reason",
    "stop_reason": "return_stop_reason",
    "cumulative_logprob": "return_cumulative_logprob",
    "perf_metrics": "sampling_param_return_perf_metrics",
}


@dataclass(frozen=True)
class Call:
    """One request as the ensemble's: its inputs, the outputs to ask for, and which to answer."""

    inputs: dict[str, np.ndarray]
    outputs: tuple[str, ...]
    finish_reason: bool = False
    stop_reason: bool = False
    cumulative_logprob: bool = False
    perf_metrics: bool = False


def _ensemble_value(name: str, reader: RequestTensors) -> np.ndarray | None:
    """The value of the LLM-API input `name` for its ensemble input, checked (bounds, one value,
    UTF-8) under its own name; None when absent without a default."""
    tensor, target = reader.declared[name], _ENSEMBLE[_TARGET[name]]
    if name not in reader and tensor.optional and tensor.default is None:
        return None
    dtype = contract.NUMPY_DTYPES[target.dtype]
    if target.dtype == "BYTES" and target.dims == (-1,):  # a list: the stop strings
        texts = [s.encode() for s in reader.texts(name)]
        return np.array(texts, dtype=dtype) if texts else None
    if target.dtype == "BYTES":  # the prompt, the adapter's name: one text
        return np.array([reader.text(name).encode()], dtype=dtype)
    if target.dtype == "FP32":
        return np.array([reader.number(name)], dtype=dtype)
    if target.dtype == "BOOL":
        return np.array([reader.flag(name)], dtype=dtype)
    return np.array([reader.integer(name)], dtype=dtype)


def ensemble_call(tensors: Mapping[str, np.ndarray]) -> Call:
    """The ensemble request for one `tensorrt_llm` request; InvalidRequest naming the LLM-API
    tensor when a value is out of range or not served."""
    reader = RequestTensors(tensors, INPUTS)
    for name, why in _REFUSED.items():
        if name in reader:
            raise InvalidRequest(f"{name}: {why}")
    if reader.integer("sampling_param_best_of") != 1:
        raise InvalidRequest(
            "sampling_param_best_of: only 1 is served (one sequence per request); send several "
            "requests with different sampling_param_seed instead"
        )
    if reader.flag("stop"):
        raise InvalidRequest("stop: cancelling a request by its id is not served; cancel the request itself")
    inputs = {}
    for name in _TARGET:
        value = _ensemble_value(name, reader)
        if value is not None:
            inputs[_TARGET[name]] = value
    asked = {flag: reader.flag(name) for flag, name in _SWITCHES.items()}
    outputs = ["text_output", "finish_reason"]
    outputs += ["stop_reason"] if asked["stop_reason"] else []
    outputs += ["cum_log_probs"] if asked["cumulative_logprob"] else []
    outputs += ["prompt_tokens", "kv_cache_reused_blocks", *_SAME_METRICS] if asked["perf_metrics"] else []
    return Call(inputs, tuple(outputs), **asked)


# The tensors an error may name for an LLM-API input: its ensemble input, the model inputs that one
# feeds (top_p → the engine's runtime_top_p), and what preprocessing makes of max_tokens. A flag has
# no bad value (and "stream" is a word too).
_FED = {tensor.name: targets.split() for tensor, targets in contract.ENSEMBLE_INPUTS}
_MADE_FROM = {"max_tokens": ("request_output_len",)}
_OURS_TO_THEIRS = {
    ours: t.name
    for t, target in contract.LLM_API_INPUTS
    if target and t.dtype != "BOOL"
    for ours in (target, *(fed.split(".")[1] for fed in _FED[target]), *_MADE_FROM.get(target, ()))
    if ours != t.name
}
_OUR_NAMES = re.compile(r"\b(" + "|".join(map(re.escape, _OURS_TO_THEIRS)) + r")\b")


def renamed(message: str) -> str:
    """An ensemble error's message with its input names as the LLM API's."""
    return _OUR_NAMES.sub(lambda m: _OURS_TO_THEIRS[m.group(1)], message)


class Answer:
    """One request's responses: each ensemble response → the LLM API's outputs (a Translation
    of ensemble_bls)."""

    def __init__(self, call: Call, block_size: int) -> None:
        self.call = call
        self.block_size = block_size
        self.text = b""
        self.inputs, self.outputs = call.inputs, call.outputs

    @classmethod
    def start(cls, tensors: Mapping[str, np.ndarray], wanted: frozenset[str], block_size: int) -> Answer:
        """`wanted` (the outputs the client named) changes nothing: the return_* inputs choose."""
        return cls(ensemble_call(tensors), block_size)

    @staticmethod
    def renamed(message: str) -> str:
        return renamed(message)

    def convert(self, outputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
        """The response's outputs, and whether it is the request's last (it carries a finish reason)."""
        self.text += b"".join(bytes(piece) for piece in outputs["text_output"].reshape(-1)[:1])
        ours = _text(outputs["finish_reason"])
        out: dict[str, object] = {"text_output": [self.text]}
        if self.call.finish_reason:
            out["finish_reason"] = [FINISH_REASONS.get(ours, NOT_YET).encode()]
        if self.call.stop_reason:
            out["stop_reason"] = [(_text(outputs["stop_reason"]) or NOT_YET).encode()]
        if self.call.cumulative_logprob:
            out["cumulative_logprob"] = outputs["cum_log_probs"].reshape(-1)[:1]
        if self.call.perf_metrics:
            out |= self._perf_metrics(outputs)
        return {name: np.asarray(value, _OUTPUT_TYPES[name]) for name, value in out.items()}, bool(ours)

    def _perf_metrics(self, outputs: Mapping[str, np.ndarray]) -> dict[str, object]:
        """The engine's metrics, and the prompt's blocks the prefix cache missed (its whole blocks
        and the partial last one) with the hit rate, as TensorRT-LLM's KV-cache metrics count them."""
        reused = int(outputs["kv_cache_reused_blocks"].reshape(-1)[0])
        prompt_blocks = math.ceil(int(outputs["prompt_tokens"].reshape(-1)[0]) / self.block_size)
        metrics: dict[str, object] = {name: outputs[name].reshape(-1)[:1] for name in _SAME_METRICS}
        return metrics | {
            "kv_cache_reused_block": [reused],
            "kv_cache_missed_block": [prompt_blocks - reused],
            "kv_cache_hit_rate": [reused / prompt_blocks if prompt_blocks else 0.0],
        }


def _text(array: np.ndarray) -> str:
    """Beam 0's value of a per-beam BYTES output ("" when it has none)."""
    values = array.reshape(-1)
    return bytes(values[0]).decode() if values.size else ""
