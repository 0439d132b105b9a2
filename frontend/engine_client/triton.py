"""A small async wrapper over Triton's gRPC client: streamed and unary inference, readiness, errors.

Tensors are plain `dict[str, np.ndarray]`; their Triton types come from `tritonlm.contract`, so the
HTTP routes never spell a datatype. Every Triton failure leaves this module as an `APIError` whose
status `classify_error` chose.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol

import grpc
import numpy as np
from tritonclient.grpc import (
    MAX_GRPC_MESSAGE_SIZE,
    InferInput,
    InferRequestedOutput,
    InferResult,
    KeepAliveOptions,
    service_pb2,
)
from tritonclient.grpc import _utils as grpc_utils
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from frontend.errors import APIError
from frontend.ops.context import request_id
from frontend.ops.tracing import trace_headers
from tritonlm import contract
from tritonlm.contract import (
    EMBEDDING,
    ENGINE,
    ENSEMBLE,
    MULTIMODAL_ENCODER,
    NUMPY_DTYPES,
    POSTPROCESSING,
    PREPROCESSING,
    Tensor,
)
from tritonlm.errors import CLIENT_ERROR_MARKER, OVERLOAD_MARKER
from tritonlm.serving.model_set import kind_of

# The models of model_repository/, as the contract names them (/health waits for all of them).
MODELS = (ENSEMBLE, PREPROCESSING, ENGINE, POSTPROCESSING, EMBEDDING, MULTIMODAL_ENCODER)

# Inputs of each model we may call, by name: the contract decides every datatype.
INPUTS: dict[str, dict[str, Tensor]] = {
    ENSEMBLE: contract.by_name(tuple(t for t, _ in contract.ENSEMBLE_INPUTS)),
    PREPROCESSING: contract.by_name(contract.PREPROCESSING_INPUTS),
    ENGINE: contract.by_name(contract.ENGINE_INPUTS),
    POSTPROCESSING: contract.by_name(contract.POSTPROCESSING_INPUTS),
    EMBEDDING: contract.by_name(contract.EMBEDDING_INPUTS),
    MULTIMODAL_ENCODER: contract.by_name(contract.ENCODER_INPUTS),
}

_FINAL = "triton_final_response"

# Text Triton wraps around a composing model's message; the client only needs the message.
_WRAPPERS = re.compile(
    r"^(?:\s*\[StatusCode\.\w+\]"
    r"|\s*in ensemble '[^']*',"
    r"|\s*\[request id: [^\]]*\]"
    r"|\s*Failed to process the request\(s\) for model(?: instance)? '[^']*', message:"
    r"|\s*TritonModelException:)+\s*"
)
# The Python backend appends the model's traceback ("At:" and source lines); never show it.
_TRACEBACK = re.compile(r"\n\s*At:\s*\n.*", re.DOTALL)
_CLIENT_FAULT = re.compile(r"invalid[_ ]arg", re.IGNORECASE)
_MARKER = re.compile(re.escape(CLIENT_ERROR_MARKER) + r"\s*", re.IGNORECASE)
_UNAVAILABLE = (
    "[statuscode.unavailable]",
    "failed to connect",
    "connection refused",
    "unknown model",
    "has no available versions",
    "is not ready",
    "shutting down",
)


def _channel_args() -> list[tuple[str, int]]:
    """tritonclient's defaults, plus a short reconnect back-off: after tritonserver restarts (or
    starts late) the channel retries within a second, not after gRPC's default of up to 2 minutes
    during which every request would fail at once."""
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


def classify_error(message: str) -> tuple[int, str]:
    """Decide whose fault a Triton error is: (422, ...) the client's, (429, ...) the engine's queue is
    full ("[overloaded]"), (503, ...) Triton unreachable or not serving the model, (500, ...) anything
    else. Returns the status and a message for the client.

    Our models mark client mistakes with "[invalid argument]"; Triton's own status text for
    TRITONSERVER_ERROR_INVALID_ARG (e.g. "[StatusCode.INVALID_ARGUMENT]") counts as well, since how a
    Python-backend TritonError's code survives a gRPC stream is not pinned down yet.
    """
    text = _TRACEBACK.sub("", message).strip()
    cleaned = _WRAPPERS.sub("", text).strip() or text
    lowered = text.lower()
    if OVERLOAD_MARKER in text:  # the engine's waiting queue is full: retry later
        return 429, cleaned.replace(OVERLOAD_MARKER, "").strip()
    if _CLIENT_FAULT.search(text):
        return 422, _MARKER.sub("", cleaned).strip() or "invalid request"
    if any(needle in lowered for needle in _UNAVAILABLE):
        return 503, f"inference server unavailable: {cleaned}"
    return 500, f"inference failed: {cleaned}"


def _clean(message: str) -> str:
    """A Triton message without its wrappers and the Python traceback."""
    text = _TRACEBACK.sub("", message).strip()
    return _WRAPPERS.sub("", text).strip() or text


def _error(message: str) -> APIError:
    return APIError(*classify_error(message))


def _rpc_message(error: grpc.RpcError) -> str:
    # Same form as tritonclient's InferenceServerException, so classify_error sees one format.
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return f"[{code}] {details}" if code is not None else str(details)


def tensors(model: str, **values: Any) -> dict[str, np.ndarray]:
    """Input arrays for `model`, typed as the contract declares (a scalar becomes shape [1])."""
    result = {}
    for name, value in values.items():
        spec = INPUTS[model][name]
        items = value if isinstance(value, (list, tuple)) else [value]
        if spec.dtype == "BYTES":
            items = [v.encode() if isinstance(v, str) else v for v in items]
        result[name] = np.array(items, dtype=NUMPY_DTYPES[spec.dtype])
    return result


def _inputs(model: str, arrays: dict[str, np.ndarray]) -> list[InferInput]:
    table = INPUTS[kind_of(model)]  # a served model's Triton name: its kind's tensors
    result = []
    for name, value in arrays.items():
        spec = table[name]  # KeyError here is a frontend bug: a tensor the contract does not name
        array = np.asarray(value, dtype=NUMPY_DTYPES[spec.dtype])
        infer_input = InferInput(name, list(array.shape), spec.dtype)
        infer_input.set_data_from_numpy(array)
        result.append(infer_input)
    return result


def _outputs(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    result = InferResult(response)
    return {out.name: result.as_numpy(out.name) for out in response.outputs}


class Triton(Protocol):
    """What the frontend needs from Triton: a `TritonClient`, a `Router` over replicas, or a test fake."""

    def stream(
        self, model: str, inputs: dict[str, np.ndarray], outputs: Iterable[str] | None = None
    ) -> AsyncIterator[dict[str, np.ndarray]]: ...

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    async def ready(self, models: Iterable[str]) -> bool: ...

    async def model_parameters(self, model: str) -> dict[str, str]: ...

    async def load(self, model: str) -> None: ...

    async def unload(self, model: str) -> None: ...


class TritonClient:
    """`server_id`: the id the launcher gave its tritonserver (`--id`); when set, `ready` is true
    only if the server answering at `url` has it, so a stale server left on the port by an earlier
    run is never taken for ours."""

    def __init__(
        self, url: str, client: InferenceServerClient | None = None, server_id: str | None = None
    ) -> None:
        self.url = url
        self.server_id = server_id
        self._client = client or InferenceServerClient(url, channel_args=_channel_args())

    async def close(self) -> None:
        await self._client.close()

    def urls(self) -> list[str]:
        """The gRPC addresses of the servers behind this client: its one."""
        return [self.url]

    async def server_name(self) -> str | None:
        """The id the server at `url` reports (`--id`), or None when it does not answer."""
        try:
            return (await self._client.get_server_metadata()).name
        except (InferenceServerException, grpc.RpcError):
            return None

    async def ready(self, models: Iterable[str] = MODELS) -> bool:
        try:
            checks = await asyncio.gather(*(self._client.is_model_ready(m) for m in models))
        except (InferenceServerException, grpc.RpcError):
            return False
        if self.server_id is not None and await self.server_name() != self.server_id:
            return False
        return all(checks)

    async def model_parameters(self, model: str) -> dict[str, str]:
        """The string parameters of a model's config as Triton loaded it."""
        try:
            config = await self._client.get_model_config(model, as_json=True)
        except InferenceServerException as exc:
            raise _error(str(exc)) from None
        params = config.get("config", {}).get("parameters", {})
        return {k: v.get("string_value", "") for k, v in params.items()}

    async def load(self, model: str) -> None:
        """Triton's explicit model control: (re)load `model` from the server's repository."""
        try:
            await self._client.load_model(model)
        except InferenceServerException as exc:
            raise APIError(500, f"loading the Triton model {model!r} failed: {_clean(str(exc))}") from None

    async def unload(self, model: str) -> None:
        try:
            await self._client.unload_model(model)
        except InferenceServerException as exc:
            raise APIError(500, f"unloading the Triton model {model!r} failed: {_clean(str(exc))}") from None

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            result = await self._client.infer(
                model, _inputs(model, inputs), request_id=request_id(), headers=trace_headers()
            )
        except InferenceServerException as exc:
            raise _error(str(exc)) from None
        return _outputs(result.get_response())

    async def stream(
        self, model: str, inputs: dict[str, np.ndarray], outputs: Iterable[str] | None = None
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request on a decoupled model: yields the outputs of each non-empty response (only
        `outputs` when given, else all) and stops after the final one. Closing or cancelling the
        iterator early cancels the gRPC stream, which makes Triton cancel the request (the engine
        stops generating for it)."""
        request = grpc_utils._get_inference_request(
            model_name=model,
            inputs=_inputs(model, inputs),
            model_version="",
            request_id=request_id(),  # the HTTP request's X-Request-Id, in Triton's logs and errors
            outputs=None if outputs is None else [InferRequestedOutput(name) for name in outputs],
            sequence_id=0,
            sequence_start=False,
            sequence_end=False,
            priority=0,
            timeout=None,
            parameters=None,
        )
        # The aio client refuses "triton_*" request parameters, so set it as the sync client's
        # async_stream_infer(enable_empty_final_response=True) does: the final flag then always
        # arrives, on an empty response if need be, and we know when the request is over.
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        over = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request
            await over.wait()  # keep our side of the stream open until the final response

        # The request's span context (traceparent), when tracing is on: Triton's own spans join it.
        metadata = tuple((trace_headers() or {}).items())
        call = self._client._client_stub.ModelStreamInfer(requests(), metadata=metadata)
        finished = False
        try:
            async for response in call:
                if response.error_message:
                    raise _error(response.error_message)
                params = response.infer_response.parameters
                if response.infer_response.outputs:
                    yield _outputs(response.infer_response)
                if _FINAL in params and params[_FINAL].bool_param:
                    finished = True
                    return
            raise APIError(500, "inference failed: Triton closed the stream before the final response")
        except grpc.RpcError as exc:
            raise _error(_rpc_message(exc)) from None
        finally:
            over.set()
            if not finished:
                # Client gone, consumer stopped early, or an error: stop the request in Triton.
                with contextlib.suppress(Exception):
                    call.cancel()
