"""The ensemble's work, run by the frontend: for a request with media, multimodal_encoder (one infer:
the media's prompt-table rows), then preprocessing (one infer), then the engine (one stream),
which makes the text itself (contract.TEXT_OUTPUTS) with postprocessing's own logic, so each token
crosses the server once instead of twice. The engine's inputs are wired exactly as the ensemble wires
them (`tritonlm.serving.pbtxt.ensemble_steps`, from the contract), and its outputs carry the ensemble's names.

Why not the Triton ensemble itself: Triton 2.51 cancels an ensemble request only in the steps that
have not started yet, and the engine's request has started, so a client that went away left its
sequence generating to the end. Here the engine's own gRPC stream is cancelled, which the engine
sees (`is_cancelled`) and retires the sequence at its next step. The ensemble stays for gRPC clients.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

import numpy as np

from frontend.engine_client.steps import Triton
from frontend.engine_client.triton import ENSEMBLE, MULTIMODAL_ENCODER, PREPROCESSING
from tritonlm.serving import contract
from tritonlm.serving.pbtxt import ensemble_steps

ENGINE = "engine"
# For each step: its input name -> the ensemble tensor feeding it; its output -> the ensemble tensor.
_STEPS = ensemble_steps()
# The ensemble's outputs are the engine's text and passed-through outputs, under the same names.
ENSEMBLE_OUTPUTS = tuple(t.name for t in contract.ENSEMBLE_OUTPUTS)
assert set(ENSEMBLE_OUTPUTS) <= {t.name for t in contract.ENGINE_OUTPUTS}
# The ensemble tensor that carries the encoder's table (the client's rows, then the media's) to the engine.
_TABLE = _STEPS[MULTIMODAL_ENCODER][1]["prompt_embedding_table"]


def _feed(step: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs of `step` among the ensemble tensors known so far (absent ones stay absent)."""
    return {name: tensors[source] for name, source in _STEPS[step][0].items() if source in tensors}


def _produced(step: str, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    mapping = _STEPS[step][1]
    return {mapping[name]: value for name, value in outputs.items() if name in mapping}


class Pipeline:
    """A `Triton` whose `stream(ENSEMBLE, …)` runs preprocessing and the engine itself; everything
    else goes to the wrapped client."""

    def __init__(self, triton: Triton) -> None:
        self.triton = triton

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return await self.triton.infer(model, inputs)

    async def ready(self, models: Iterable[str]) -> bool:
        return await self.triton.ready(models)

    async def stream(
        self, model: str, inputs: dict[str, np.ndarray], outputs: Iterable[str] | None = None
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        if model != ENSEMBLE:
            async for response in self.triton.stream(model, inputs, outputs):
                yield response
            return
        tensors = dict(inputs)
        if "media" in tensors:
            # The prompt inputs only size a request in the ensemble (contract.ENCODER_ANCHORS).
            feed = _feed(MULTIMODAL_ENCODER, tensors)
            for name in contract.ENCODER_ANCHORS:
                feed.pop(name, None)
            tensors.update(_produced(MULTIMODAL_ENCODER, await self.triton.infer(MULTIMODAL_ENCODER, feed)))
        elif "prompt_embedding_table" in tensors:  # no media: the client's table goes to the engine as is
            tensors[_TABLE] = tensors["prompt_embedding_table"]
        tensors.update(
            _produced(PREPROCESSING, await self.triton.infer(PREPROCESSING, _feed(PREPROCESSING, tensors)))
        )
        wanted = ENSEMBLE_OUTPUTS if outputs is None else tuple(outputs)
        # aclosing: leaving early closes the engine's stream now, which cancels its request.
        upstream = self.triton.stream(ENGINE, _feed(ENGINE, tensors), wanted)
        async with contextlib.aclosing(upstream) as responses:
            async for response in responses:
                yield response
