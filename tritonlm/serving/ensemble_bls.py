"""NVIDIA's model names over the ensemble (`tensorrt_llm`, `tensorrt_llm_bls`), behind Triton: each
request runs through its served model's ensemble (a BLS call, on a thread of its own so requests
overlap), its tensors and responses translated by a pure module (`llm_api`, `trtllm_bls`). Imported
only inside Triton's Python backend.

Triton 2.51 cannot cancel a BLS request: a client that goes away gets no more responses, but the
ensemble's request runs to its end (as a cancelled ensemble request does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonlm import contract
from tritonlm.contract import Tensor
from tritonlm.serving import model_set, triton_glue

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class Translation(Protocol):
    """One request in the ensemble's names, and its responses back in the model's."""

    inputs: dict[str, np.ndarray]  # the ensemble request's
    outputs: tuple[str, ...]  # the ensemble outputs to ask for

    def convert(self, outputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
        """A response's outputs, and whether it is the request's last."""
        ...

    def renamed(self, message: str) -> str:
        """An ensemble error's message in the model's names."""
        ...


# A request's inputs (as read) and the outputs its client asked for → its translation; raises
# InvalidRequest (naming the tensor) for a request the model refuses.
Translate = Callable[[dict[str, np.ndarray], frozenset[str]], Translation]


class EnsembleBls:
    def __init__(self, args: dict, inputs: tuple[Tensor, ...], translate: Translate) -> None:
        self.ensemble = model_set.beside(args["model_name"], contract.ENSEMBLE)
        self.inputs = inputs
        self.translate = translate

    def submit(self, requests: list) -> None:
        for request in requests:
            threading.Thread(target=self._run, args=(request,), name="ensemble-bls", daemon=True).start()

    def _run(self, request: object) -> None:
        sender = request.get_response_sender()
        try:
            self._forward(request, sender)
        except Exception as error:  # before anything was sent, or the ensemble call failed
            if not sender.is_cancelled():
                sender.send(triton_glue.error_response(error), flags=FINAL)

    def _forward(self, request: object, sender: object) -> None:
        wanted = frozenset(request.requested_output_names())
        translation = self.translate(triton_glue.read_inputs(request, self.inputs), wanted)
        inner = pb_utils.InferenceRequest(
            model_name=self.ensemble,
            inputs=[pb_utils.Tensor(name, value) for name, value in translation.inputs.items()],
            requested_output_names=list(translation.outputs),
        )
        done = False
        for response in inner.exec(decoupled=True):
            if done or sender.is_cancelled():
                done = True  # the ensemble's request goes on to its end; nobody reads it
                continue
            if response.has_error():
                error = response.error()
                sender.send(_error(translation.renamed(error.message()), error.code()), flags=FINAL)
                done = True
                continue
            outputs = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if outputs:
                converted, done = translation.convert(outputs)
                sender.send(_response(converted), flags=FINAL if done else 0)
        if not done:
            sender.send(flags=FINAL)


def _response(outputs: dict[str, np.ndarray]) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in outputs.items()])


def _error(message: str, code: int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
