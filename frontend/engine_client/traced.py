"""The Triton calls as OpenTelemetry spans, when tracing is on (frontend/ops/tracing.py): `TracedTriton`
wraps whatever serves the app's Triton calls (a `TritonClient`, a `Router`, a test's fake), so each
infer or stream (the media encoder, preprocessing, the engine, the embedding model) is one CLIENT span,
a child of the request's span, current while Triton is called, so `TritonClient` sends its context on
in the gRPC metadata.

Attributes after OpenTelemetry's GenAI conventions where they fit: the engine's stream is a
`text_completion` (the engine completes the prompt preprocessing rendered), the embedding model's
infer `embeddings`; the sampling parameters are read from the request's tensors, the usage and finish
reasons from the responses' (the outputs every generation asks for: steps.STEP_OUTPUTS).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import numpy as np
from opentelemetry import context, trace
from opentelemetry.trace import SpanKind

from frontend.engine_client.triton import Triton
from frontend.ops.context import request_id
from frontend.ops.tracing import REQUEST_ID, mark_failed
from tritonlm.contract import EMBEDDING, ENGINE
from tritonlm.serving.model_set import kind_of

Arrays = dict[str, np.ndarray]

PROVIDER = "tritonlm"  # gen_ai.provider.name: no well-known value fits a self-hosted server
OPERATIONS = {ENGINE: "text_completion", EMBEDDING: "embeddings"}  # the GenAI operations
# The engine's request tensors that GenAI names: its sampling parameters as the engine gets them.
REQUEST_ATTRIBUTES = {
    "request_output_len": "gen_ai.request.max_tokens",
    "temperature": "gen_ai.request.temperature",
    "runtime_top_p": "gen_ai.request.top_p",
    "runtime_top_k": "gen_ai.request.top_k",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "random_seed": "gen_ai.request.seed",
}


class TracedTriton:
    """`triton` with its infer and stream calls traced by `tracer`; `served_name(triton_name)`: the
    name clients use for the model a Triton model belongs to (gen_ai.request.model). Every other
    attribute (ready, load, model_parameters, …) is `triton`'s own, untraced."""

    def __init__(self, triton: Triton, tracer: trace.Tracer, served_name: Callable[[str], str]) -> None:
        self.triton = triton
        self.tracer = tracer
        self.served_name = served_name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.triton, name)

    async def infer(self, model: str, inputs: Arrays) -> Arrays:
        span = self._start("infer", model, inputs)
        try:
            with _current(span):
                outputs = await self.triton.infer(model, inputs)
            if kind_of(model) == EMBEDDING:
                _embedded(span, outputs)
            return outputs
        finally:
            span.end()

    async def stream(
        self, model: str, inputs: Arrays, outputs: Iterable[str] | None = None
    ) -> AsyncIterator[Arrays]:
        span = self._start("stream", model, inputs)
        usage = _Usage(span)
        upstream = self.triton.stream(model, inputs, outputs)
        try:
            while True:
                # Current only while Triton is awaited: a generator must not leave its span current
                # in its consumer's context between responses.
                with _current(span):
                    try:
                        response = await anext(upstream)
                    except StopAsyncIteration:
                        break
                usage.read(response)
                yield response
        finally:
            await upstream.aclose()  # closing early cancels the engine's request
            usage.close()
            span.end()

    def _start(self, call: str, model: str, inputs: Arrays) -> trace.Span:
        kind = kind_of(model)
        operation = OPERATIONS.get(kind)
        attributes: dict[str, Any] = {REQUEST_ID: request_id(), "tritonlm.triton.model": model}
        if operation is None:  # preprocessing, the media encoder: Triton models, not GenAI operations
            return self.tracer.start_span(f"{call} {model}", kind=SpanKind.CLIENT, attributes=attributes)
        served = self.served_name(model)
        attributes.update(
            {
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.request.model": served,
            }
        )
        if kind == ENGINE:
            for tensor, name in REQUEST_ATTRIBUTES.items():
                if tensor in inputs and np.size(inputs[tensor]) == 1:
                    attributes[name] = np.asarray(inputs[tensor]).reshape(-1)[0].item()
        return self.tracer.start_span(f"{operation} {served}", kind=SpanKind.CLIENT, attributes=attributes)


@contextlib.contextmanager
def _current(span: trace.Span) -> Iterator[None]:
    """`span` current (Triton's metadata carries it), and marked when the call fails."""
    token = context.attach(trace.set_span_in_context(span))
    try:
        yield
    except Exception as error:  # not BaseException: a cancelled call is no failure of Triton's
        mark_failed(span, error)
        raise
    finally:
        context.detach(token)


def _first(array: np.ndarray | None) -> int | None:
    return int(array.reshape(-1)[0]) if array is not None and array.size else None


def _new_tokens(response: Arrays) -> int:
    """The first sequence's (beam's) tokens in a response: its sequence_length, else its output_ids' row."""
    length = _first(response.get("sequence_length"))
    if length is not None:
        return length
    ids = response.get("output_ids")
    return int(ids.shape[-1]) if ids is not None and ids.ndim else 0


def _embedded(span: trace.Span, outputs: Arrays) -> None:
    tokens, vectors = outputs.get("token_count"), outputs.get("embedding")
    if tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", int(tokens.sum()))
    if vectors is not None and vectors.ndim:
        span.set_attribute("gen_ai.embeddings.dimension.count", int(vectors.shape[-1]))


class _Usage:
    """One engine stream's token counts, first-token time and finish reasons, from its responses
    (compact streams: the prompt's counts come once, each response carries its new tokens)."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.started = time.monotonic()
        self.first_token: float | None = None
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.output_tokens = 0
        self.finish_reasons: list[str] = []

    def read(self, response: Arrays) -> None:
        for name in ("prompt_tokens", "cached_tokens"):  # the first response's
            value = _first(response.get(name))
            if value is not None:
                setattr(self, name, value)
        new = _new_tokens(response)
        if new and self.first_token is None:
            self.first_token = time.monotonic()
        self.output_tokens += new
        reasons = response.get("finish_reason")
        if reasons is not None:
            texts = (r.decode() if isinstance(r, bytes) else str(r) for r in reasons.reshape(-1))
            self.finish_reasons = [r for r in texts if r] or self.finish_reasons

    def close(self) -> None:
        span = self.span
        if self.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", self.prompt_tokens)
        if self.cached_tokens is not None:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", self.cached_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", self.output_tokens)
        if self.finish_reasons:
            span.set_attribute("gen_ai.response.finish_reasons", self.finish_reasons)
        if self.first_token is not None:
            span.set_attribute("gen_ai.response.time_to_first_chunk", self.first_token - self.started)
