"""Triton adapter for embedding: texts -> vectors. The logic is tritonlm.embedding.embedder."""

from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonlm import contract
from tritonlm.embedding import config as embedding_config
from tritonlm.embedding.embedder import Embedder, with_instruction
from tritonlm.errors import InvalidRequest
from tritonlm.serving import stub_process, triton_glue


def _texts(inputs: dict[str, np.ndarray]) -> list[str]:
    """A request's texts ([n, 1] BYTES), each with its instruction prepended."""
    try:
        texts = [v.decode("utf-8") for v in inputs["text"].reshape(-1)]
        instructions = [v.decode("utf-8") for v in inputs.get("instruction", np.array([])).reshape(-1)]
    except UnicodeDecodeError as error:
        raise InvalidRequest(f"text and instruction must be UTF-8 ({error})") from None
    if instructions and len(instructions) != len(texts):
        raise InvalidRequest(f"instruction has {len(instructions)} rows, text has {len(texts)}")
    return [with_instruction(t, i) for t, i in zip(texts, instructions or [""] * len(texts), strict=True)]


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        stub_process.guard()  # ends with tritonserver, and ends fast
        params = triton_glue.parameters(args)
        directory = embedding_config.model_dir(params.get("model_dir", ""))
        self.embedder = Embedder(directory, params.get("device") or "auto")

    def execute(self, requests: list) -> list:
        # Every text of every request the dynamic batcher gathered goes through one forward pass;
        # a request whose inputs are bad fails alone.
        texts: list[str] = []
        spans: dict[int, tuple[int, int]] = {}
        failed: dict[int, Exception] = {}
        for i, request in enumerate(requests):
            try:
                own = _texts(triton_glue.read_inputs(request, contract.EMBEDDING_INPUTS))
            except Exception as error:
                failed[i] = error
                continue
            spans[i] = (len(texts), len(texts) + len(own))
            texts += own
        try:
            vectors, counts = self.embedder.encode(texts)
        except Exception as error:
            return [triton_glue.error_response(failed.get(i, error)) for i in range(len(requests))]
        responses = []
        for i in range(len(requests)):
            if i in failed:
                responses.append(triton_glue.error_response(failed[i]))
                continue
            start, end = spans[i]
            outputs = [
                pb_utils.Tensor("embedding", vectors[start:end]),
                pb_utils.Tensor("token_count", counts[start:end].reshape(-1, 1)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
