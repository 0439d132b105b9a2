"""The frontend's way to the engine, model by model: the multimodal encoder (one infer, only for a
request with media), preprocessing (one infer), then the engine's own gRPC stream.

Each model gets what it declares in the contract, by name: the job's values (`Job.values`, in the
models' tensor names) and the outputs of the models before it, an output `out_x` feeding the input
`x` (the names the ensemble's wiring, `tritonlm.serving.pbtxt`, follows too). The engine is asked for
the outputs its caller reads, the text among them (contract.TEXT_OUTPUTS: the engine detokenizes with
postprocessing's logic, so each token crosses the server once, not twice).

Why not the Triton `ensemble` (which stays, for gRPC clients): Triton 2.51 cancels an ensemble
request only in the steps that have not started yet, and the engine's has, so a client that went
away left its sequence generating to the end. Here closing the stream cancels the engine's own gRPC
request, which the engine sees (`is_cancelled`) and retires the sequence at its next step.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import numpy as np

from frontend.engine_client.lora import engine_stream
from frontend.engine_client.request import Job
from frontend.engine_client.served import DEFAULT, ServedModel
from frontend.engine_client.triton import INPUTS, Triton, tensors
from tritonlm import contract
from tritonlm.contract import ENGINE, MULTIMODAL_ENCODER, PREPROCESSING

Arrays = dict[str, np.ndarray]

# The outputs a model hands to the models after it, which take those they declare (preprocessing's
# input_token_texts is for clients that list the prompt's tokens: no engine input).
_OUTPUTS: dict[str, frozenset[str]] = {
    MULTIMODAL_ENCODER: frozenset(t.name for t in contract.ENCODER_OUTPUTS),
    PREPROCESSING: frozenset(t.name for t in contract.PREPROCESSING_OUTPUTS),
}


def model_inputs(model: str, values: Mapping[str, Any], *upstream: Arrays) -> Arrays:
    """The inputs of `model`: the job's `values` it declares, typed by the contract, then the
    arrays of earlier models' outputs (`passed_on`) it declares, which win."""
    declared = INPUTS[model]
    result = tensors(model, **{name: value for name, value in values.items() if name in declared})
    for arrays in upstream:
        result.update({name: array for name, array in arrays.items() if name in declared})
    return result


def passed_on(model: str, outputs: Arrays) -> Arrays:
    """`model`'s declared outputs under the input names they feed: `out_end_id` feeds `end_id`."""
    return {name.removeprefix("out_"): array for name, array in outputs.items() if name in _OUTPUTS[model]}


class EngineClient:
    """One job's sequences on the engine, over `triton` (a `TritonClient`, a `Router` or a fake),
    on the Triton models of the job's served model (`Job.served`; None: the default model)."""

    def __init__(self, triton: Triton, served: ServedModel | None = None) -> None:
        self.triton = triton
        self.served = served
        self.names = served.models if served is not None else DEFAULT

    def in_use(self) -> contextlib.AbstractContextManager[None]:
        """While a request runs on the served model (unloading it waits for none)."""
        return self.served.in_use.held() if self.served is not None else contextlib.nullcontext()

    async def encode(self, values: Mapping[str, Any]) -> Arrays:
        """The encoder's outputs for the job's media, passed on ({} without media). The prompt's
        own inputs only size a request in the ensemble (contract.ENCODER_ANCHORS): not sent."""
        if "media" not in values:
            return {}
        feed = model_inputs(
            MULTIMODAL_ENCODER, {k: v for k, v in values.items() if k not in contract.ENCODER_ANCHORS}
        )
        encoder = self.names.triton_name(MULTIMODAL_ENCODER)
        return passed_on(MULTIMODAL_ENCODER, await self.triton.infer(encoder, feed))

    async def preprocess(self, values: Mapping[str, Any], encoded: Arrays) -> Arrays:
        """Preprocessing's outputs: the prompt's token ids (and texts), the stop lists, …"""
        feed = model_inputs(PREPROCESSING, values, encoded)
        return await self.triton.infer(self.names.triton_name(PREPROCESSING), feed)

    async def prompt(self, job: Job) -> Arrays:
        """Preprocessing's outputs for `job`, its media's positions counted (the encoder's rows)."""
        values = job.values()
        with self.in_use():
            return await self.preprocess(values, await self.encode(values))

    async def stream(self, job: Job, index: int, outputs: Iterable[str]) -> AsyncIterator[Arrays]:
        """Sequence `index` of `job`: the engine's responses, each with the `outputs` asked for."""
        with self.in_use():
            values = job.values(index)
            encoded = await self.encode(values)
            preprocessed = passed_on(PREPROCESSING, await self.preprocess(values, encoded))
            asked = tuple(outputs)
            engine_name = self.names.triton_name(ENGINE)

            def engine(lora: Arrays) -> AsyncIterator[Arrays]:
                feed = model_inputs(ENGINE, values, preprocessed, encoded, lora)
                return self.triton.stream(engine_name, feed, asked)

            # A run-time adapter goes by task id, with its weights when the engine lacks them.
            upstream = engine({}) if job.lora is None else engine_stream(job.lora, engine)
            # aclosing: leaving early closes the engine's stream now, which cancels its request.
            async with contextlib.aclosing(upstream) as responses:
                async for response in responses:
                    yield response
