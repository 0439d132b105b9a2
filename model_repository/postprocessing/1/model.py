"""Triton adapter for postprocessing: engine responses -> text. The logic is tritonlm.postprocess.

Runs as one instance (config.pbtxt) because it keeps each streaming request's state between calls.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import triton_python_backend_utils as pb_utils

try:
    import tritonlm  # noqa: F401
except ImportError:  # not installed into Triton's Python: use the checkout this repository lives in
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tritonlm import contract  # noqa: E402
from tritonlm.postprocess import Postprocessor  # noqa: E402
from tritonlm.preprocess import InvalidRequest  # noqa: E402
from tritonlm.tokenization import load_tokenizer  # noqa: E402


def _model_dir(args: dict) -> str:
    params = json.loads(args["model_config"]).get("parameters", {})
    model_dir = params.get("model_dir", {}).get("string_value", "") or os.environ.get("MODEL_DIR", "")
    if not model_dir:
        raise pb_utils.TritonModelException(
            "set the model_dir parameter or the MODEL_DIR environment variable"
        )
    return model_dir


def _error(message: str, code: int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.postprocessor = Postprocessor(load_tokenizer(_model_dir(args)))

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:  # in arrival order, so a stream's responses are handled in order
            inputs = {}
            for t in contract.POSTPROCESSING_INPUTS:
                tensor = pb_utils.get_input_tensor_by_name(request, t.name)
                inputs[t.name] = None if tensor is None else tensor.as_numpy()
            try:
                outputs = self.postprocessor.process(inputs)
            except InvalidRequest as e:
                responses.append(_error(str(e), pb_utils.TritonError.INVALID_ARG))
                continue
            except Exception as e:  # report it on this request, keep serving the rest
                responses.append(_error(f"postprocessing failed: {e!r}", pb_utils.TritonError.INTERNAL))
                continue
            tensors = [pb_utils.Tensor(name, value) for name, value in outputs.items()]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
