"""The HTTP frontend without Triton: a fake with TritonClient's stream/infer/ready methods stands in."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from fastapi.testclient import TestClient
from tritonclient.grpc import service_pb2

from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.engine_client.triton import (
    ENGINE,
    ENSEMBLE,
    INPUTS,
    PREPROCESSING,
    TritonClient,
    classify_error,
)
from frontend.errors import APIError
from tritonlm.contract import NUMPY_DTYPES

# ---------------------------------------------------------------------------------------------
# A fake Triton: each "response" is a list of (id, piece, logprob, special); the engine's text of
# a response is the concatenation of its pieces unless given explicitly.


def response(tokens, finish="", text=None, prompt_tokens=4) -> dict[str, np.ndarray]:
    n = len(tokens)
    pieces = [t[1] for t in tokens]
    return {
        "text_output": np.array([("".join(pieces) if text is None else text).encode()], dtype=object),
        "output_ids": np.array([[t[0] for t in tokens]], dtype=np.int32).reshape(1, n),
        "output_log_probs": np.array([[[t[2] for t in tokens]]], dtype=np.float32).reshape(1, 1, n),
        "token_texts": np.array([p.encode() for p in pieces], dtype=object).reshape(n),
        "token_special": np.array([t[3] for t in tokens], dtype=np.bool_).reshape(n),
        "finish_reason": np.array([finish.encode()], dtype=object),
        "prompt_tokens": np.array([prompt_tokens], dtype=np.int32),
    }


HELLO = [
    response([(10, "Hello", -0.5, False)]),
    response([(11, ",", -0.25, False), (12, " world", -1.0, False)]),
    response([(2, "", -0.1, True)], finish="end_id"),
]


class FakeTriton:
    def __init__(self, responses=None, error: APIError | None = None, error_after: int = 0, delay=0.0):
        self.responses = HELLO if responses is None else responses
        self.error, self.error_after, self.delay = error, error_after, delay
        self.calls: list[tuple[str, dict[str, np.ndarray]]] = []
        self.is_ready = True
        self.closed = asyncio.Event()  # set when a stream's generator is finalized (done or cancelled)
        self.completed = False

    async def stream(
        self, model: str, inputs: dict[str, np.ndarray], outputs=None
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        self.calls.append((model, inputs))
        self.outputs = outputs
        try:
            for i, out in enumerate(self.responses):
                if self.error is not None and i == self.error_after:
                    raise self.error
                if self.delay:
                    await asyncio.sleep(self.delay)
                yield out
            if self.error is not None and self.error_after >= len(self.responses):
                raise self.error
            self.completed = True
        finally:
            self.closed.set()

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append((model, inputs))
        return {
            "input_ids": np.array([[1, 15043]], dtype=np.int32),
            "input_token_texts": np.array([b"<s>", b"Hi"], dtype=object),
        }

    async def ready(self, models) -> bool:
        return self.is_ready


def client_for(fake: FakeTriton) -> TestClient:
    return TestClient(
        create_app(FrontendConfig(triton_urls="unused:8001", served_model_name="test-model"), triton=fake)
    )


def post(fake: FakeTriton, body) -> object:
    return client_for(fake).post("/", json=body)


# What the fake's preprocessing makes that reaches the engine (not part of what a request asked for).
PREPROCESSED = {"input_ids"}


def request_inputs(fake: FakeTriton) -> list[dict[str, np.ndarray]]:
    """Per engine request: its preprocessing inputs and its own engine inputs (model tensor names)."""
    result, pre = [], {}
    for model, inputs in fake.calls:
        if model == PREPROCESSING:
            pre = inputs
        elif model == ENGINE:
            result.append(pre | {k: v for k, v in inputs.items() if k not in PREPROCESSED})
    return result


def sent_inputs(fake: FakeTriton) -> dict[str, np.ndarray]:
    """What the last engine request sent."""
    return request_inputs(fake)[-1]


def events(text: str) -> list[dict]:
    chunks = [c for c in text.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks), text
    return [json.loads(c.removeprefix("data: ")) for c in chunks]


# ---------------------------------------------------------------------------------------------
# Validation: every invalid parameter is a 422 in TGI's shape naming the parameter.

INVALID = [
    ({}, "inputs"),
    ({"inputs": ""}, "inputs"),
    ({"inputs": 5}, "inputs"),
    ({"inputs": []}, "inputs"),
    ({"inputs": [{"type": "text", "text": ""}]}, "inputs[0].text"),
    ({"inputs": [{"type": "image_url", "image_url": 5}]}, "inputs[0].image_url"),
    ({"inputs": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}, "inputs[0].type"),
    ({"inputs": [{"type": {}, "audio_url": ""}]}, "inputs[0].type"),  # found by schemathesis: was a 500
    ({"inputs": "x" * (4 * 1024 * 1024 + 1)}, "inputs"),
    ({"parameters": {"decoder_input_details": "true"}}, "parameters.decoder_input_details"),
    ({"parameters": {"decoder_input_details": True}, "stream": True}, "parameters.decoder_input_details"),
    ({"parameters": {"details": 1}}, "parameters.details"),
    ({"parameters": {"do_sample": "true"}}, "parameters.do_sample"),
    ({"parameters": {"max_new_tokens": 0}}, "parameters.max_new_tokens"),
    ({"parameters": {"max_new_tokens": 2147483648}}, "parameters.max_new_tokens"),
    ({"parameters": {"max_new_tokens": 1.5}}, "parameters.max_new_tokens"),
    ({"parameters": {"max_new_tokens": True}}, "parameters.max_new_tokens"),
    ({"parameters": {"max_new_tokens": "20"}}, "parameters.max_new_tokens"),
    ({"parameters": {"repetition_penalty": 0}}, "parameters.repetition_penalty"),
    ({"parameters": {"repetition_penalty": -1.0}}, "parameters.repetition_penalty"),
    ({"parameters": {"return_full_text": 0}}, "parameters.return_full_text"),
    ({"parameters": {"seed": 0}}, "parameters.seed"),
    ({"parameters": {"seed": 18446744073709551616}}, "parameters.seed"),
    ({"parameters": {"seed": 3.0}}, "parameters.seed"),
    ({"parameters": {"temperature": 0}}, "parameters.temperature"),
    ({"parameters": {"temperature": 1e-6}}, "parameters.temperature"),
    ({"parameters": {"temperature": True}}, "parameters.temperature"),
    ({"parameters": {"top_k": 0}}, "parameters.top_k"),
    ({"parameters": {"top_k": 2147483648}}, "parameters.top_k"),
    ({"parameters": {"top_k": 10.5}}, "parameters.top_k"),
    ({"parameters": {"top_p": 1.0}}, "parameters.top_p"),
    ({"parameters": {"top_p": 1e-6}}, "parameters.top_p"),
    ({"parameters": {"top_p": 0}}, "parameters.top_p"),
    ({"parameters": {"truncate": 0}}, "parameters.truncate"),
    ({"parameters": {"truncate": 2147483648}}, "parameters.truncate"),
    ({"parameters": {"typical_p": 0.0}}, "parameters.typical_p"),
    ({"parameters": {"typical_p": 1.01}}, "parameters.typical_p"),
    ({"parameters": {"watermark": "false"}}, "parameters.watermark"),
    ({"parameters": {"stop": ""}}, "parameters.stop"),
    ({"parameters": {"stop": [""]}}, "parameters.stop"),
    ({"parameters": {"stop": ["a" * 1025]}}, "parameters.stop"),
    ({"parameters": {"stop": ["a"] * 1025}}, "parameters.stop"),
    ({"parameters": {"stop": ["a" * 1024] * 33}}, "parameters.stop"),
    ({"parameters": {"stop": [1]}}, "parameters.stop"),
    ({"parameters": {"stop": 5}}, "parameters.stop"),
    ({"parameters": {"adapter_id": "my-lora"}}, "not found; this server has no LoRA adapters"),
    ({"parameters": {"adapter_id": "bad id!"}}, "parameters.adapter_id"),
    ({"parameters": {"adapter_id": "a" * 257}}, "parameters.adapter_id"),
    ({"parameters": {"best_of": 2}}, "parameters.best_of"),
    ({"parameters": 5}, "parameters"),
    ({"stream": "true"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"foo": 1}, "foo"),
]


@pytest.mark.parametrize(("patch", "named"), INVALID, ids=[str(i) for i in range(len(INVALID))])
def test_invalid_parameter_is_422_naming_it(patch, named):
    body = {"inputs": "Hi", **patch} if "inputs" not in patch and patch != {} else dict(patch)
    fake = FakeTriton()
    r = post(fake, body)
    assert r.status_code == 422, r.text
    payload = r.json()
    assert payload["error_type"] == "validation"
    assert named in payload["error"]
    assert "Traceback" not in payload["error"]
    assert not fake.calls  # nothing reached Triton


def test_messages_say_what_is_allowed():
    r = post(FakeTriton(), {"inputs": "Hi", "parameters": {"top_p": 1.0}})
    assert r.json()["error"] == "parameters.top_p: must be a number in (1e-06, 1.0)"
    r = post(FakeTriton(), {"inputs": "Hi", "parameters": {"max_new_tokens": 0}})
    assert r.json()["error"] == "parameters.max_new_tokens: must be an integer in (0, 2147483647]"
    r = post(FakeTriton(), {"inputs": "Hi", "parameters": {"best_of": 2}})
    assert r.json()["error"].startswith("parameters.best_of: unknown field")


def test_malformed_json_and_non_object_body():
    client = client_for(FakeTriton())
    r = client.post("/", content=b'{"inputs": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in r.json()["error"]
    r = client.post("/", json=["Hi"])
    assert r.status_code == 422 and r.json()["error"] == "request body must be a JSON object"


@pytest.mark.parametrize(
    "parameters",
    [
        {"top_p": 0.999, "typical_p": 1.0, "seed": 18446744073709551615, "temperature": 1},
        {"seed": None, "truncate": None, "stop": [], "adapter_id": "None"},
        {"adapter_id": None, "stop": "x" * 1024, "max_new_tokens": 2147483647},
        {"stop": ["a" * 1024] * 32, "repetition_penalty": 1.03, "watermark": True},
    ],
)
def test_boundary_values_are_accepted(parameters):
    r = post(FakeTriton(), {"inputs": "Hi", "parameters": parameters})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------------------------------------
# What reaches preprocessing and the engine: TGI's sampling decision and the engine's greedy convention.


def sent(parameters: dict, stream: bool = False) -> dict[str, np.ndarray]:
    fake = FakeTriton()
    r = post(fake, {"inputs": "Hi", "parameters": parameters, "stream": stream})
    assert r.status_code == 200, r.text
    return sent_inputs(fake)


def test_greedy_sends_no_sampling_inputs():
    inputs = sent({})
    assert set(inputs) == {"text_input", "max_tokens", "streaming"}
    assert inputs["text_input"].tolist() == [b"Hi"]
    assert inputs["max_tokens"].tolist() == [20]
    assert inputs["streaming"].tolist() == [False]
    types = INPUTS[PREPROCESSING] | INPUTS[ENGINE]
    for name, array in inputs.items():
        assert array.dtype == NUMPY_DTYPES[types[name].dtype], name


@pytest.mark.parametrize(
    "parameters",
    [{"temperature": 1.0}, {"typical_p": 1.0}, {"do_sample": False}, {"seed": 7}, {"top_p": None}],
)
def test_parameters_that_do_not_change_the_distribution_stay_greedy(parameters):
    inputs = sent(parameters)
    assert not {"temperature", "runtime_top_k", "runtime_top_p", "typical_p", "random_seed"} & set(inputs)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({"do_sample": True}, {"temperature": 1.0, "runtime_top_p": 1.0}),
        ({"temperature": 0.5}, {"temperature": 0.5, "runtime_top_p": 1.0}),
        ({"top_k": 10}, {"temperature": 1.0, "runtime_top_p": 1.0, "runtime_top_k": 10}),
        ({"top_p": 0.95}, {"temperature": 1.0, "runtime_top_p": 0.95}),
        ({"typical_p": 0.5}, {"temperature": 1.0, "runtime_top_p": 1.0, "typical_p": 0.5}),
        (
            {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 42},
            {"temperature": 0.7, "runtime_top_k": 5, "runtime_top_p": 0.9, "random_seed": 42},
        ),
    ],
)
def test_sampling_inputs(parameters, expected):
    inputs = sent(parameters)
    for name, value in expected.items():
        assert inputs[name].tolist() == pytest.approx([value]), name
    for name in {"runtime_top_k", "typical_p"} - set(expected):
        assert name not in inputs
    assert inputs["random_seed"].dtype == np.uint64 and inputs["random_seed"][0] > 0


def test_other_parameters_map_to_model_inputs():
    inputs = sent(
        {
            "max_new_tokens": 7,
            "repetition_penalty": 1.2,
            "watermark": True,
            "stop": ["\n", "END"],
            "truncate": 100,
            "details": True,
        },
        stream=True,
    )
    assert inputs["max_tokens"].tolist() == [7]
    assert inputs["repetition_penalty"].tolist() == pytest.approx([1.2])
    assert inputs["watermark"].tolist() == [True]
    assert inputs["stop_words"].tolist() == [b"\n", b"END"]
    assert inputs["truncate"].tolist() == [100]
    assert inputs["streaming"].tolist() == [True]
    assert inputs["return_log_probs"].tolist() == [True]
    assert sent({"stop": "x"})["stop_words"].tolist() == [b"x"]


# ---------------------------------------------------------------------------------------------
# Response shapes.


def test_plain_response_is_a_list_without_details():
    r = post(FakeTriton(), {"inputs": "Hi"})
    assert r.status_code == 200
    assert r.json() == [{"generated_text": "Hello, world"}]


def test_details_response():
    fake = FakeTriton()
    r = post(fake, {"inputs": "Hi", "parameters": {"details": True, "return_full_text": True}})
    (item,) = r.json()
    assert item["generated_text"] == "HiHello, world"
    details = item["details"]
    assert details == {
        "prompt_tokens": 4,
        "finish_reason": "eos_token",
        "generated_tokens": 4,
        "prefill": [],
        "seed": None,
        "tokens": [
            {"id": 10, "logprob": -0.5, "special": False, "text": "Hello"},
            {"id": 11, "logprob": -0.25, "special": False, "text": ","},
            {"id": 12, "logprob": -1.0, "special": False, "text": " world"},
            {"id": 2, "logprob": pytest.approx(-0.1), "special": True, "text": ""},
        ],
    }
    assert [c[0] for c in fake.calls] == [PREPROCESSING, ENGINE]


def test_logprobs_are_null_unless_requested_and_seed_reported_when_sampling():
    fake = FakeTriton([response([(5, "a", -2.0, False)], finish="length")])
    r = post(fake, {"inputs": "Hi", "parameters": {"details": True, "seed": 9, "top_k": 3}})
    details = r.json()[0]["details"]
    assert details["seed"] == 9 and details["finish_reason"] == "length"
    assert details["tokens"][0]["logprob"] == -2.0
    fake = FakeTriton([response([(5, "a", float("-inf"), False)], finish="stop_words")])
    details = post(fake, {"inputs": "Hi", "parameters": {"details": True}}).json()[0]["details"]
    assert details["tokens"][0]["logprob"] is None  # -inf is not JSON
    assert details["finish_reason"] == "stop_sequence"


def test_decoder_input_details_adds_prefill_from_preprocessing():
    fake = FakeTriton()
    r = post(fake, {"inputs": "Hi", "parameters": {"decoder_input_details": True, "truncate": 5}})
    details = r.json()[0]["details"]
    assert details["prefill"] == [
        {"id": 1, "logprob": None, "special": None, "text": "<s>"},
        {"id": 15043, "logprob": None, "special": None, "text": "Hi"},
    ]
    model, inputs = fake.calls[0]
    assert model == PREPROCESSING
    assert set(inputs) == {"text_input", "max_tokens", "truncate"}
    assert inputs["truncate"].dtype == np.int32


def test_stream_events():
    r = post(FakeTriton(), {"inputs": "Hi", "parameters": {"details": True}, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    assert [e["token"]["id"] for e in evs] == [[10], [11], [12], [2]]
    # Several tokens in one response: one event each, the response's text on the last.
    assert [e["token"]["text"] for e in evs] == ["Hello", "", ", world", ""]
    assert [e["token"]["special"] for e in evs] == [False, False, False, True]
    assert evs[0]["token"]["logprob"] == -0.5
    assert [e["generated_text"] for e in evs] == [None, None, None, "Hello, world"]
    assert [e["details"] for e in evs[:-1]] == [None] * 3
    assert evs[-1]["details"] == {
        "prompt_tokens": 4,
        "finish_reason": "eos_token",
        "generated_tokens": 4,
        "seed": None,
    }


def test_stream_without_details_and_with_held_back_text():
    responses = [
        response([(1, "\xe4", -1.0, False)], text=""),  # held back by postprocessing
        response([(2, "x", -1.0, False)], text="\xe4x"),
        response([], finish="length", text="!"),  # a final response without tokens
    ]
    r = post(
        FakeTriton(responses), {"inputs": "Hi", "stream": True, "parameters": {"return_full_text": True}}
    )
    evs = events(r.text)
    assert [e["token"]["id"] for e in evs] == [[1], [2], []]
    assert [e["token"]["text"] for e in evs] == ["", "\xe4x", "!"]
    assert [e["token"]["logprob"] for e in evs] == [None, None, None]
    assert evs[-1]["generated_text"] == "Hi\xe4x!" and evs[-1]["details"] is None


def test_error_before_the_first_token_gets_its_status():
    error = APIError(*classify_error("in ensemble 'ensemble', [invalid argument] prompt has 9000 tokens"))
    for stream in (False, True):
        r = post(FakeTriton(error=error), {"inputs": "Hi", "stream": stream})
        assert r.status_code == 422
        assert r.json() == {"error": "prompt has 9000 tokens", "error_type": "validation"}


def test_error_after_the_stream_started_is_an_event():
    fake = FakeTriton(error=APIError(500, "inference failed: engine died"), error_after=1)
    r = post(fake, {"inputs": "Hi", "stream": True})
    assert r.status_code == 200
    evs = events(r.text)
    assert evs[0]["token"]["id"] == [10]
    assert evs[-1] == {"error": "inference failed: engine died", "error_type": "generation"}


def test_stream_ending_without_finish_reason_is_an_error_event():
    r = post(FakeTriton(HELLO[:2]), {"inputs": "Hi", "stream": True})
    assert events(r.text)[-1]["error_type"] == "generation"
    r = post(FakeTriton(HELLO[:2]), {"inputs": "Hi"})
    assert r.status_code == 500 and "finish reason" in r.json()["error"]


# ---------------------------------------------------------------------------------------------
# Health and model list.


def test_health_and_models():
    fake = FakeTriton()
    client = client_for(fake)
    assert client.get("/health").json() == {"status": "ok"}
    fake.is_ready = False
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["error_type"] == "unhealthy"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "test-model"


# ---------------------------------------------------------------------------------------------
# Client disconnects cancel the Triton request.


async def _run_asgi(app, body: dict, disconnect_after_chunks: int | None) -> list[dict]:
    """Drive the ASGI app by hand: the client disconnects after N body chunks (None: right away)."""
    sent_messages: list[dict] = []
    chunks = asyncio.Event() if disconnect_after_chunks else None
    request_sent = False

    async def receive():
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        if chunks is not None:
            await chunks.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent_messages.append(message)
        bodies = [m for m in sent_messages if m["type"] == "http.response.body" and m.get("body")]
        if chunks is not None and len(bodies) >= disconnect_after_chunks:
            chunks.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("test", 1),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent_messages


ENDLESS = [response([(i, "x", 0.0, False)]) for i in range(10_000)]


def test_stream_disconnect_cancels_the_triton_stream():
    async def scenario():
        fake = FakeTriton(ENDLESS, delay=0.01)
        messages = await _run_asgi(
            create_app(FrontendConfig(served_model_name="m"), triton=fake),
            {"inputs": "Hi", "stream": True},
            3,
        )
        await asyncio.wait_for(fake.closed.wait(), timeout=1)
        assert not fake.completed
        bodies = [m for m in messages if m["type"] == "http.response.body" and m.get("body")]
        assert 3 <= len(bodies) < 10

    asyncio.run(scenario())


def test_non_stream_disconnect_cancels_the_triton_stream():
    async def scenario():
        fake = FakeTriton(ENDLESS, delay=0.01)
        messages = await _run_asgi(
            create_app(FrontendConfig(served_model_name="m"), triton=fake), {"inputs": "Hi"}, None
        )
        await asyncio.wait_for(fake.closed.wait(), timeout=1)
        assert not fake.completed
        assert messages[0]["status"] == 499

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------
# TritonClient.stream over a fake gRPC stub: final flag, errors, cancellation.


def grpc_response(ids=None, final=False, error="") -> service_pb2.ModelStreamInferResponse:
    r = service_pb2.ModelStreamInferResponse(error_message=error)
    if ids is not None:
        out = r.infer_response.outputs.add(name="output_ids", datatype="INT32", shape=[1, len(ids)])
        del out
        r.infer_response.raw_output_contents.append(np.array([ids], dtype=np.int32).tobytes())
    if final:
        r.infer_response.parameters["triton_final_response"].bool_param = True
    return r


class FakeCall:
    def __init__(self, responses, requests):
        self.responses, self.requests = responses, requests
        self.cancelled = False

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        async for request in self.requests:  # the request, then wait (as gRPC would, concurrently)
            self.request = request
            break
        for r in self.responses:
            if isinstance(r, Exception):
                raise r
            yield r
        await asyncio.Event().wait()  # a stream that stays open

    def cancel(self):
        self.cancelled = True


class FakeStub:
    def __init__(self, responses):
        self.responses = responses

    def ModelStreamInfer(self, requests, metadata=()):  # noqa: N802 (gRPC's name)
        self.metadata = metadata
        self.call = FakeCall(self.responses, requests)
        return self.call


class FakeAioClient:
    def __init__(self, responses):
        self._client_stub = FakeStub(responses)


def triton_stream(responses, take: int | None = None):
    async def scenario():
        fake = FakeAioClient(responses)
        client = TritonClient("-", client=fake)
        stream = client.stream(ENSEMBLE, {"text_input": np.array([b"Hi"], dtype=object)})
        got = []
        try:
            async for out in stream:
                got.append(out["output_ids"].tolist())
                if take is not None and len(got) == take:
                    await stream.aclose()
                    break
        except APIError as exc:
            got.append(exc)
        return got, fake._client_stub.call

    return asyncio.run(scenario())


def test_triton_stream_stops_at_the_final_response_without_cancelling():
    got, call = triton_stream(
        [grpc_response([5]), grpc_response([6], final=False), grpc_response(final=True)]
    )
    assert got == [[[5]], [[6]]]
    assert not call.cancelled
    assert call.request.parameters["triton_enable_empty_final_response"].bool_param
    assert call.request.inputs[0].name == "text_input" and call.request.inputs[0].datatype == "BYTES"


def test_triton_stream_cancels_when_the_consumer_stops():
    got, call = triton_stream([grpc_response([5]), grpc_response([6])], take=1)
    assert got == [[[5]]] and call.cancelled


def test_triton_stream_errors_are_classified():
    got, call = triton_stream([grpc_response(error="in ensemble 'ensemble', [invalid argument] bad stop")])
    assert isinstance(got[0], APIError) and got[0].status == 422 and got[0].message == "bad stop"
    assert call.cancelled

    class Unavailable(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "failed to connect to all addresses"

    got, _ = triton_stream([Unavailable()])
    assert got[0].status == 503


@pytest.mark.parametrize(
    ("message", "status", "text"),
    [
        ("[invalid argument] max_tokens must be positive", 422, "max_tokens must be positive"),
        ("in ensemble 'ensemble', [invalid argument] prompt too long", 422, "prompt too long"),
        (
            "[StatusCode.INVALID_ARGUMENT] unexpected shape for input 'x'",
            422,
            "unexpected shape for input 'x'",
        ),
        ("INVALID_ARG: bad input", 422, "INVALID_ARG: bad input"),
        ("[StatusCode.UNAVAILABLE] failed to connect to all addresses", 503, None),
        ("Request for unknown model: 'ensemble' is not found", 503, None),
        (
            "Failed to process the request(s) for model 'engine_0_0', message: RuntimeError: CUDA OOM\n\n"
            "At:\n  /models/engine/1/model.py(10): execute\n",
            500,
            "inference failed: RuntimeError: CUDA OOM",
        ),
    ],
)
def test_classify_error(message, status, text):
    got_status, got_text = classify_error(message)
    assert got_status == status
    if text is not None:
        assert got_text == text
    assert "At:" not in got_text and "model.py" not in got_text


# The one engine client: a Job becomes tensors by one sampling rule, and a model's error is named
# in the caller's API.
def test_one_sampling_rule_for_every_api():
    from frontend.engine_client.request import Job

    def sampling(**fields):
        values = Job(prompt="Hi", **fields).values(index=1)
        names = {"temperature", "runtime_top_p", "runtime_top_k", "typical_p", "random_seed"}
        return {k: v for k, v in values.items() if k in names}

    assert sampling(sample=False) == {}  # TGI's greedy: the engine's defaults
    assert sampling(temperature=0.0) == {"temperature": 0.0}  # OpenAI's greedy, as given
    assert sampling() == {"temperature": 1.0, "runtime_top_p": 1.0}  # top_p 0 would mean greedy
    assert sampling(temperature=0.5, top_p=0.9, top_k=5, typical_p=0.4, seed=7) == pytest.approx(
        {"temperature": 0.5, "runtime_top_p": 0.9, "runtime_top_k": 5, "typical_p": 0.4, "random_seed": 8}
    )


def test_model_errors_are_named_in_the_callers_api():
    from frontend.engine_client.request import Job

    def named(message: str, **fields) -> APIError:
        return Job(prompt="Hi", **fields).named(APIError(422, message))

    tgi = {"prompt_param": "inputs", "max_tokens_param": "max_new_tokens"}
    message = "request_output_len: prompt tokens + request_output_len must be <= 512; got 5 + 600"
    assert named(message, **tgi).message.startswith("max_new_tokens: prompt tokens + max_new_tokens")
    assert named(message, **tgi).param == "max_new_tokens"
    assert named(message).param == "max_tokens"
    assert named(message, max_tokens_param="max_completion_tokens").param == "max_completion_tokens"
    assert named("input_ids: the prompt has 600 tokens", **tgi).message.startswith("inputs: ")
    assert named("something else").param is None


# ---------------------------------------------------------------------------------------------
# LoRA adapters by name: each API's field becomes the engine's lora_name (end to end in test_lora_serving)
def test_adapter_names_select_lora_name_in_every_api():
    fake = FakeTriton()
    client = TestClient(
        create_app(
            FrontendConfig(triton_urls="unused:8001", served_model_name="test-model"),
            triton=fake,
            lora_adapters=["sql"],
        )
    )
    cards = client.get("/v1/models").json()["data"]
    assert [(c["id"], c.get("parent")) for c in cards][:2] == [("test-model", None), ("sql", "test-model")]
    r = client.post("/", json={"inputs": "Hi", "parameters": {"adapter_id": "sql"}})
    assert r.status_code == 200 and sent_inputs(fake)["lora_name"].tolist() == [b"sql"]
    client.post("/", json={"inputs": "Hi", "parameters": {"adapter_id": "None"}})
    assert "lora_name" not in sent_inputs(fake)
    r = client.post("/v1/completions", json={"model": "sql", "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == "sql"
    assert sent_inputs(fake)["lora_name"].tolist() == [b"sql"]
    client.post("/serving-endpoints/sql/invocations", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert sent_inputs(fake)["lora_name"].tolist() == [b"sql"]
    r = client.post("/", json={"inputs": "Hi", "parameters": {"adapter_id": "nope"}})
    assert (
        r.status_code == 422 and "parameters.adapter_id" in r.json()["error"] and "sql" in r.json()["error"]
    )
    r = client.post("/v1/embeddings", json={"model": "sql", "input": "Hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
