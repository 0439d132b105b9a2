"""End to end: a real tritonserver with the real model repository, and the real frontend."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from client.bench import engine_stats
from client.stream import StreamClient, make_inputs

pytestmark = pytest.mark.usefixtures("servers")

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "今天天气很好,我们去公园散步吧。",
    "東京は日本の首都です。",
    "Emoji time 👍🏽 👨‍👩‍👧 🇯🇵 🎉",
    "A",
    "Once upon a time, in a land far away, there lived a king who had three daughters and a very old dog.",
]


def post(servers, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(servers.frontend_url + "/", json=body, timeout=timeout)


def stream_events(servers, body: dict) -> list[dict]:
    events = []
    with httpx.stream("POST", servers.frontend_url + "/", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    return events


def engine_stat(servers, name: str) -> float:
    stats = engine_stats(servers.metrics_url)
    assert name in stats, f"metric {name} missing"
    return stats[name]


def test_greedy_matches_transformers_generate_under_concurrency(servers):
    prompts = [p * (1 + i % 3) for i, p in enumerate(PROMPTS * 3)]  # 24 prompts, varied lengths
    body = {"parameters": {"max_new_tokens": 24, "decoder_input_details": True}}
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda p: post(servers, {"inputs": p, **body}).json(), prompts))
    model = AutoModelForCausalLM.from_pretrained(servers.model_dir)
    for result in results:
        details = result[0]["details"]
        prompt_ids = [t["id"] for t in details["prefill"]]
        got = [t["id"] for t in details["tokens"]]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt_ids]),
                max_new_tokens=24,
                do_sample=False,
                eos_token_id=model.config.eos_token_id,
            )
        assert got == out[0, len(prompt_ids) :].tolist()


def test_concurrent_requests_share_forward_steps(servers):
    def run(text: str) -> list[int]:
        client = StreamClient(servers.grpc_url)
        try:
            sizes = []
            for out in client.generate("ensemble", {"text_input": [text], "max_tokens": 16, "stream": True}):
                sizes += out["batch_size"].tolist()
            return sizes
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        sizes = [s for r in pool.map(run, PROMPTS) for s in r]
    assert len(sizes) == 8 * 16
    assert max(sizes) > 1


@pytest.mark.parametrize("text", ["Tell me a story about", "请告诉我一个故事", "🎉🎊 party 🥳 time 👍🏽"])
def test_streamed_text_equals_non_streamed(servers, text):
    body = {"inputs": text, "parameters": {"max_new_tokens": 40}}
    full = post(servers, body).json()[0]["generated_text"]
    events = stream_events(servers, body)
    assert "".join(e["token"]["text"] for e in events) == full
    assert events[-1]["generated_text"] == full
    assert all(e["generated_text"] is None for e in events[:-1])


def test_seeded_sampling_is_independent_of_the_batch(servers):
    seeded = {
        "inputs": "Random words:",
        "parameters": {
            "do_sample": True,
            "seed": 1234,
            "temperature": 0.9,
            "max_new_tokens": 20,
            "details": True,
        },
    }
    alone = [t["id"] for t in post(servers, seeded).json()[0]["details"]["tokens"]]
    noise = {"parameters": {"do_sample": True, "max_new_tokens": 30}}
    with ThreadPoolExecutor(9) as pool:
        others = [pool.submit(post, servers, {"inputs": p, **noise}) for p in PROMPTS]
        busy = pool.submit(post, servers, seeded).result().json()
        assert all(f.result().status_code == 200 for f in others)
    assert [t["id"] for t in busy[0]["details"]["tokens"]] == alone


def _wait_until_idle(servers, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    stats = ("running", "waiting", "kv_blocks_used")
    while any(engine_stat(servers, name) != 0 for name in stats):
        assert time.monotonic() < deadline, "a cancelled request still holds its KV blocks"
        time.sleep(0.1)


def test_cancelled_grpc_stream_frees_its_slot(servers):
    # Straight to the engine: Triton 2.51 does not pass a cancellation on to an ensemble step that
    # has started (the HTTP frontend therefore calls the three models itself; see ARCHITECTURE.md).
    client = StreamClient(servers.grpc_url)
    request = {"input_ids": [5, 6, 7], "request_output_len": 1500, "streaming": True, "end_id": -1}
    tokens = client.generate("engine", request)
    for _ in range(3):
        next(tokens)
    deadline = time.monotonic() + 10
    while engine_stat(servers, "running") != 1:  # the gauges refresh every 0.5 s
        assert time.monotonic() < deadline, "the streaming request never showed as running"
        time.sleep(0.05)
    client.cancel()
    _wait_until_idle(servers)


def test_http_client_disconnect_frees_its_slot(servers):
    body = {"inputs": "Go on and on", "parameters": {"max_new_tokens": 1500}, "stream": True}
    with httpx.stream("POST", servers.frontend_url + "/", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(line for line in lines if line.startswith("data:"))
    _wait_until_idle(servers)


def test_tgi_example_returns_the_documented_shape(servers):
    body = {
        "inputs": "My name is Olivier and I",
        "parameters": {
            "decoder_input_details": True,
            "details": True,
            "do_sample": True,
            "max_new_tokens": 20,
            "repetition_penalty": 1.03,
            "return_full_text": False,
            "seed": None,
            "temperature": 0.5,
            "top_k": 10,
            "top_p": 0.95,
            "truncate": None,
            "typical_p": 0.5,
            "watermark": False,
            "stop": ["stop1", "stop2"],
            "adapter_id": "None",
        },
        "stream": False,
    }
    response = post(servers, body)
    assert response.status_code == 200, response.text
    [result] = response.json()
    details = result["details"]
    assert set(result) == {"details", "generated_text"}
    assert set(details) >= {"prompt_tokens", "finish_reason", "generated_tokens", "prefill", "seed", "tokens"}
    assert details["finish_reason"] in ("length", "eos_token", "stop_sequence")
    assert details["generated_tokens"] == len(details["tokens"]) >= 1
    assert details["prompt_tokens"] == len(details["prefill"])
    assert isinstance(details["seed"], int)
    for token in details["tokens"]:
        assert set(token) == {"id", "logprob", "special", "text"}
        assert isinstance(token["logprob"], float)
    assert isinstance(result["generated_text"], str)


def test_stream_event_format(servers):
    events = stream_events(servers, {"inputs": "Hi", "parameters": {"max_new_tokens": 5, "details": True}})
    assert len(events) == 5
    for event in events:
        assert isinstance(event["token"]["id"], list) and len(event["token"]["id"]) == 1
    assert events[-1]["details"]["generated_tokens"] == 5
    assert events[-1]["details"]["finish_reason"] == "length"
    assert all(e["details"] is None for e in events[:-1])


def test_stop_string_ends_generation_and_is_excluded(servers):
    free = post(servers, {"inputs": "Hello", "parameters": {"max_new_tokens": 30}}).json()[0][
        "generated_text"
    ]
    stop = free[5:8]
    assert stop and stop in free
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 30, "stop": [stop], "details": True}}
    result = post(servers, body).json()[0]
    assert result["generated_text"] == free[: free.index(stop)]
    assert result["details"]["finish_reason"] == "stop_sequence"
    events = stream_events(servers, body)
    assert "".join(e["token"]["text"] for e in events) == result["generated_text"]


@pytest.mark.parametrize("text", ["Hello", "🎉🎊 party 🥳 time 👍🏽"])
def test_engine_text_equals_the_ensembles(servers, text):
    # The HTTP frontend takes its text from the engine; gRPC clients of the ensemble get
    # postprocessing's, from the same code. Both must agree, stop strings included.
    free = post(servers, {"inputs": text, "parameters": {"max_new_tokens": 30}}).json()[0]["generated_text"]
    stop = free[6:9]
    body = {"inputs": text, "parameters": {"max_new_tokens": 30, "stop": [stop]}}
    via_engine = "".join(e["token"]["text"] for e in stream_events(servers, body))
    client = StreamClient(servers.grpc_url)
    try:
        request = {"text_input": [text], "max_tokens": 30, "stop_words": [stop], "stream": True}
        pieces = [out["text_output"][0].decode() for out in client.generate("ensemble", request)]
    finally:
        client.close()
    assert via_engine == "".join(pieces) == free[: free.index(stop)]


@pytest.mark.parametrize(
    "parameters, name",
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 2**31}, "max_new_tokens"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"temperature": 0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 1.0}, "top_p"),
        ({"top_p": 0}, "top_p"),
        ({"typical_p": 0}, "typical_p"),
        ({"typical_p": 1.5}, "typical_p"),
        ({"truncate": 0}, "truncate"),
        ({"seed": 0}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"stop": ""}, "stop"),
        ({"stop": ["x" * 1025]}, "stop"),
        ({"watermark": "yes"}, "watermark"),
        ({"details": 1}, "details"),
        ({"adapter_id": "my-lora"}, "adapter_id"),
        ({"max_new_tokens": 2100}, "max_new_tokens"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_invalid_parameters_get_422_naming_them(servers, parameters, name):
    response = post(servers, {"inputs": "Hello", "parameters": parameters})
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}
    assert name in body["error"] or (name == "max_new_tokens" and "request_output_len" in body["error"])


def test_invalid_requests_get_4xx(servers):
    assert post(servers, {"inputs": ""}).status_code == 422
    assert post(servers, {"inputs": [{"type": "text", "text": "hi"}]}).status_code == 400  # text-only model
    both = {"inputs": "hi", "parameters": {"decoder_input_details": True}, "stream": True}
    assert post(servers, both).status_code == 422
    too_long = post(servers, {"inputs": "hello " * 5000})
    assert too_long.status_code == 422 and "tokens" in too_long.json()["error"]
    assert httpx.post(servers.frontend_url + "/", content=b"{not json", timeout=10).status_code == 422


def test_health_and_models(servers):
    assert httpx.get(servers.frontend_url + "/health").status_code == 200
    models = httpx.get(servers.frontend_url + "/v1/models").json()
    assert models["data"][0]["id"] == servers.model_name


def test_engine_rejects_unimplemented_tensors_by_name(servers):
    client = StreamClient(servers.grpc_url)
    try:
        for name, value in [("beam_width", 17), ("draft_logits", [[0.0]]), ("lora_task_id", 3)]:
            with pytest.raises(RuntimeError, match=name):
                list(
                    client.generate("engine", {"input_ids": [1, 2, 3], "request_output_len": 4, name: value})
                )
        ids = [
            o["output_ids"]
            for o in client.generate("engine", {"input_ids": [1, 2, 3], "request_output_len": 4})
        ]
        assert ids[-1].shape == (1, 4)
    finally:
        client.close()


def test_overload_beyond_the_queue_gets_429_and_the_server_keeps_serving(servers):
    # conftest starts Triton with a small TRITONLM_MAX_QUEUE_SIZE: fill the 32 running places and
    # the queue with long requests straight to the engine, on one gRPC stream.
    queue = servers.max_queue_size
    client = StreamClient(servers.grpc_url)
    long = {"input_ids": [1, 2, 3], "request_output_len": 2000}
    try:
        for _ in range(32 + queue):
            client.client.async_stream_infer("engine", make_inputs("engine", long))
        deadline = time.monotonic() + 20
        while engine_stat(servers, "running") != 32 or engine_stat(servers, "waiting") != queue:
            assert time.monotonic() < deadline, "the engine never filled up"
            time.sleep(0.05)
        assert client.responses.empty()  # none refused (nor finished)
        response = post(servers, {"inputs": "Hello", "parameters": {"max_new_tokens": 4}})
        assert response.status_code == 429, response.text
        assert response.headers["retry-after"] == "1"
        body = response.json()
        assert body["error_type"] == "overloaded"
        assert "overloaded" in body["error"] and "retry later" in body["error"]
        streamed = httpx.post(
            servers.frontend_url + "/", json={"inputs": "Hello", "stream": True}, timeout=30
        )
        assert streamed.status_code == 429 and "retry-after" in streamed.headers
    finally:
        client.cancel()
        client.close()
    _wait_until_idle(servers)
    ok = post(servers, {"inputs": "Hello", "parameters": {"max_new_tokens": 4}})
    assert ok.status_code == 200, ok.text


def test_a_shared_prompt_prefix_is_reported_as_cached_tokens(servers):
    prefix = f"Session {time.time_ns()}: you are a careful assistant who answers in full sentences. " * 6

    def complete(question: str) -> dict:
        body = {"model": servers.model_name, "prompt": prefix + question, "max_tokens": 8, "temperature": 0}
        response = httpx.post(servers.frontend_url + "/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    first = complete("What is the capital of France?")
    second = complete("Name a large river.")
    again = complete("Name a large river.")
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 and cached % 16 == 0  # whole KV blocks of the shared prefix
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached
    assert again["choices"][0]["text"] == second["choices"][0]["text"]


def test_a_request_past_the_context_names_max_new_tokens(servers):
    # The engine reports it as request_output_len; POST / speaks TGI, so it names TGI's field.
    for stream in (False, True):
        body = {"inputs": "Hello", "parameters": {"max_new_tokens": 2100}, "stream": stream}
        response = post(servers, body)
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error.startswith("max_new_tokens: prompt tokens + max_new_tokens must be <= ")
        assert "request_output_len" not in error
