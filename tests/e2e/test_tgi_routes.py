"""TGI's `POST /generate`, `POST /generate_stream` and `GET /info` beside `POST /`, on a real
tritonserver and frontend, driven by huggingface_hub's InferenceClient where it calls them."""

from __future__ import annotations

import json

import httpx
import pytest
from huggingface_hub import InferenceClient

BODY = {"inputs": "My name is Olivier and I", "parameters": {"max_new_tokens": 5, "details": True}}


def post(servers, route: str, body: dict) -> httpx.Response:
    return httpx.post(servers.frontend_url + route, json=body, timeout=60)


def test_generate_is_post_slash_as_one_object(servers):
    listed = post(servers, "/", BODY)
    one = post(servers, "/generate", BODY)
    assert listed.status_code == one.status_code == 200, one.text
    assert one.json() == listed.json()[0]
    output = InferenceClient(model=servers.frontend_url + "/generate").text_generation(
        BODY["inputs"], max_new_tokens=5, details=True
    )
    assert output.generated_text == one.json()["generated_text"]
    assert output.details.generated_tokens == 5 and output.details.finish_reason == "length"


def test_generate_stream_is_post_slash_streamed(servers):
    body = {"inputs": "Hello", "parameters": {"max_new_tokens": 4}}
    streamed = post(servers, "/generate_stream", body)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    same = post(servers, "/", {**body, "stream": True})
    # The same tokens and final text. Not byte for byte: where a token ends inside a UTF-8 character,
    # which event carries the held bytes depends on how the sender grouped the steps' reports.
    events = [
        [json.loads(line.removeprefix("data: ")) for line in r.text.split("\n") if line]
        for r in (streamed, same)
    ]
    assert [[e["token"]["id"] for e in run] for run in events] == [[e["token"]["id"] for e in events[0]]] * 2
    assert events[0][-1]["generated_text"] == events[1][-1]["generated_text"]
    client = InferenceClient(model=servers.frontend_url + "/generate_stream")
    pieces = list(client.text_generation("Hello", max_new_tokens=4, stream=True))
    final = json.loads(streamed.text.strip().splitlines()[-1].removeprefix("data: "))
    assert "".join(pieces) == final["generated_text"]


def test_info(servers):
    info = InferenceClient(model=servers.frontend_url, provider="hf-inference").get_endpoint_info()
    assert info["model_id"] == servers.model_name
    assert info["model_dtype"] == "torch.float32"  # the test servers' TRITONLM_DTYPE
    assert info["max_total_tokens"] == info["max_input_tokens"] + 1 == info["max_input_length"] + 1
    assert info["version"] and info["router"] and info["model_sha"] is None
    # the engine's 429 bound: its running places and its waiting queue
    assert info["max_concurrent_requests"] == 32 + servers.max_queue_size
    long = {"inputs": "x " * info["max_total_tokens"], "parameters": {"max_new_tokens": 1}}
    assert post(servers, "/generate", long).status_code == 422  # the limit /info reports is enforced


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/generate", {**BODY, "stream": True}, "stream"),
        ("/generate_stream", {**BODY, "stream": False}, "stream"),
        (
            "/generate_stream",
            {"inputs": "x", "parameters": {"decoder_input_details": True}},
            "decoder_input_details",
        ),
        ("/generate", {"inputs": "x", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
        ("/generate_stream", {"inputs": "x", "parameters": {"top_p": 2.0}}, "top_p"),
        ("/generate", {"inputs": "x", "nope": 1}, "nope"),
    ],
)
def test_bad_requests_are_tgi_validation_errors(servers, route, body, field):
    response = post(servers, route, body)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["error_type"] == "validation" and field in error["error"]
