"""The ensemble's three steps, run by the frontend: preprocessing (one infer), the engine (one
stream), postprocessing (one infer per engine response), wired exactly as the ensemble wires them
(`tritonlm.pbtxt.ensemble_steps`, from the contract).

Why not the Triton ensemble itself: Triton 2.51 cancels an ensemble request only in the steps that
have not started yet, and the engine's request has started, so a client that went away left its
sequence generating to the end. Here the engine's own gRPC stream is cancelled, which the engine
sees (`is_cancelled`) and retires the sequence at its next step. The ensemble stays for gRPC clients.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

import numpy as np

from frontend.generation import Triton
from frontend.triton import ENSEMBLE, PREPROCESSING
from tritonlm.pbtxt import ensemble_steps

ENGINE, POSTPROCESSING = "engine", "postprocessing"
# For each step: its input name -> the ensemble tensor feeding it; its output -> the ensemble tensor.
_STEPS = ensemble_steps()


def _feed(step: str, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs of `step` among the ensemble tensors known so far (absent ones stay absent)."""
    return {name: tensors[source] for name, source in _STEPS[step][0].items() if source in tensors}


def _produced(step: str, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    mapping = _STEPS[step][1]
    return {mapping[name]: value for name, value in outputs.items() if name in mapping}


class Pipeline:
    """A `Triton` whose `stream(ENSEMBLE, …)` runs the three steps itself; everything else goes to
    the wrapped client."""

    def __init__(self, triton: Triton) -> None:
        self.triton = triton

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return await self.triton.infer(model, inputs)

    async def ready(self, models: Iterable[str]) -> bool:
        return await self.triton.ready(models)

    async def stream(self, model: str, inputs: dict[str, np.ndarray]) -> AsyncIterator[dict[str, np.ndarray]]:
        if model != ENSEMBLE:
            async for outputs in self.triton.stream(model, inputs):
                yield outputs
            return
        tensors = dict(inputs)
        tensors.update(
            _produced(PREPROCESSING, await self.triton.infer(PREPROCESSING, _feed(PREPROCESSING, tensors)))
        )
        # aclosing: leaving early closes the engine's stream now, which cancels its request.
        async with contextlib.aclosing(self.triton.stream(ENGINE, _feed(ENGINE, tensors))) as responses:
            async for engine_out in responses:
                step = _produced(ENGINE, engine_out)
                post = await self.triton.infer(POSTPROCESSING, _feed(POSTPROCESSING, step))
                yield _produced(POSTPROCESSING, post)
