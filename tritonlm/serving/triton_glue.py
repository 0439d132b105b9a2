"""What the Triton adapters (model_repository/*/1/model.py) share. Imported only inside Triton's
Python backend, where `triton_python_backend_utils` exists."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonlm import contract
from tritonlm.config import ConfigError, EngineConfig
from tritonlm.contract import Tensor
from tritonlm.errors import InvalidRequest
from tritonlm.serving import model_set


def parameters(args: dict) -> dict[str, str]:
    """config.pbtxt's string parameters."""
    config = json.loads(args["model_config"])
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


def model_dir(params: Mapping[str, str]) -> str:
    """The checkpoint directory as the engine reads it (EngineConfig: the model_dir parameter,
    TRITONLM_MODEL_DIR, else MODEL_DIR, which the launcher sets for the tritonservers)."""
    try:
        return EngineConfig.from_parameters({"model_dir": params.get("model_dir", "")}).resolved().model_dir
    except ConfigError as error:
        raise pb_utils.TritonModelException(str(error)) from None


def engine_config(args: dict) -> EngineConfig:
    """The engine's settings as the engine reads them (its config.pbtxt, then TRITONLM_* variables),
    resolved against the checkpoint; for the models beside it that must agree with it."""
    here = Path(args["model_repository"])  # this model's directory in the repository
    engine = model_set.beside(args["model_name"], contract.ENGINE)  # its served model's engine
    try:
        return EngineConfig.from_config_pbtxt(here.parent / engine / "config.pbtxt").resolved()
    except ConfigError as error:
        raise pb_utils.TritonModelException(f"engine settings: {error}") from None


def read_inputs(request: object, tensors: tuple[Tensor, ...]) -> dict[str, np.ndarray]:
    """The request's inputs that are present, as numpy arrays."""
    inputs = {}
    for t in tensors:
        tensor = pb_utils.get_input_tensor_by_name(request, t.name)
        if tensor is not None:
            inputs[t.name] = tensor.as_numpy()
    return inputs


def error_response(error: Exception) -> pb_utils.InferenceResponse:
    if isinstance(error, InvalidRequest):
        return pb_utils.InferenceResponse(
            error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG)
        )
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{error!r}", pb_utils.TritonError.INTERNAL))


def response(result: dict[str, np.ndarray] | Exception) -> pb_utils.InferenceResponse:
    """A response with these outputs, or the error response of this exception."""
    if isinstance(result, Exception):
        return error_response(result)
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(name, value) for name, value in result.items()]
    )


def respond_each(
    requests: list,
    inputs: tuple[Tensor, ...],
    process: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
) -> list:
    """Runs `process` on each request alone, so one bad request never fails the others."""
    responses = []
    for request in requests:
        try:
            outputs = process(read_inputs(request, inputs))
        except Exception as error:
            responses.append(error_response(error))
            continue
        tensors = [pb_utils.Tensor(name, value) for name, value in outputs.items()]
        responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
    return responses
