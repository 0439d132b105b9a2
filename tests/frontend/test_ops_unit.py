"""frontend/ops without Triton (a fake stands in): API keys, body limit, request ids, metrics, access
log, settings and the documented error statuses. The live-server checks are in test_ops.py."""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
from fastapi.testclient import TestClient
from test_frontend_unit import HELLO, FakeAioClient, FakeTriton, grpc_response

from frontend.app import create_app
from frontend.config import ConfigError, FrontendConfig
from frontend.engine_client.triton import ENSEMBLE, TritonClient
from frontend.errors import APIError
from frontend.ops.access_log import ACCESS_LOGGER, JsonFormatter, RequestIdFilter
from frontend.ops.auth import key_matches
from frontend.ops.context import RequestRecord, close_record, open_record

KEYS = ("key-one", "key-two")
TGI = ("/", {"inputs": "Hi", "parameters": {"max_new_tokens": 3}})
CHAT = ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "Hi"}]})
COMPLETION = ("/v1/completions", {"model": "default", "prompt": "Hi"})
EMBEDDINGS = ("/v1/embeddings", {"input": "Hi"})
INVOCATIONS = ("/serving-endpoints/default/invocations", {"prompt": "Hi"})


def client(triton=None, **settings) -> TestClient:
    app = create_app(FrontendConfig(served_model_name="default", **settings), triton=triton or FakeTriton())
    return TestClient(app, raise_server_exceptions=False)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---------------------------------------------------------------------------------------------
# API keys


@pytest.mark.parametrize("route", [TGI, CHAT, COMPLETION, EMBEDDINGS, INVOCATIONS], ids=lambda r: r[0])
def test_api_keys_guard_every_generation_and_embedding_route_in_its_api_format(route):
    c = client(api_keys=KEYS)
    path, body = route
    for headers in ({}, bearer("wrong"), {"Authorization": "key-one"}, {"Authorization": "Basic key-one"}):
        r = c.post(path, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["WWW-Authenticate"] == "Bearer"
        assert r.headers["X-Request-Id"]
        if path == "/":
            assert r.json()["error_type"] == "authentication" and "API key" in r.json()["error"]
        else:
            error = r.json()["error"]
            assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
            assert "API key" in error["message"]


def test_api_keys_let_each_key_through_and_leave_probes_open():
    c = client(api_keys=KEYS)
    for key in KEYS:
        assert c.post("/", json=TGI[1], headers=bearer(key)).status_code == 200
    assert c.get("/v1/models").status_code == 401
    assert c.get("/v1/models", headers=bearer("key-two")).status_code == 200
    for path in ("/health", "/metrics", "/openapi.json"):
        assert c.get(path).status_code == 200, path


def test_without_api_keys_nothing_is_asked():
    assert client().post("/", json=TGI[1]).status_code == 200


def test_key_matches_compares_every_key():
    keys = tuple(k.encode() for k in KEYS)
    assert key_matches("key-two", keys) and key_matches("key-one", keys)
    assert not key_matches("key-on", keys) and not key_matches("", keys) and not key_matches("ключ", keys)


# ---------------------------------------------------------------------------------------------
# Body limit


def test_body_over_the_limit_is_413_in_each_api_format_by_content_length():
    c = client(max_body_bytes=100)
    r = c.post("/", json={"inputs": "x" * 200})
    assert r.status_code == 413 and r.json()["error_type"] == "payload_too_large"
    assert "100 bytes" in r.json()["error"]
    r = c.post("/v1/completions", json={"model": "default", "prompt": "x" * 200})
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"
    assert c.post("/", json={"inputs": "x" * 10}).status_code == 200


def test_body_over_the_limit_is_413_while_reading_a_chunked_upload():
    def chunks():  # no Content-Length: the size is only known by reading
        yield b'{"inputs": "'
        for _ in range(10):
            yield b"x" * 50
        yield b'"}'

    r = client(max_body_bytes=300).post("/", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert "content-length" not in {k.lower() for k in r.request.headers}


def test_a_chunked_body_under_the_limit_is_served():
    def chunks():
        yield b'{"inputs": '
        yield b'"Hi"}'

    r = client(max_body_bytes=300).post("/", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()[0]["generated_text"] == "Hello, world"


# ---------------------------------------------------------------------------------------------
# Request ids


def test_request_id_is_the_clients_or_a_new_one_on_every_response():
    c = client()
    r = c.post("/", json=TGI[1], headers={"X-Request-Id": "client-id-1"})
    assert r.headers["X-Request-Id"] == "client-id-1"
    ids = set()
    for response in (
        c.post("/", json=TGI[1]),
        c.post("/", json={"inputs": ""}),  # 422
        c.post("/v1/completions", json={"model": "nope", "prompt": "x"}),  # 404
        c.get("/no/such/path"),
        c.post("/", json=TGI[1], headers={"X-Request-Id": 'has spaces; and a quote"'}),  # refused: new
        c.post("/", json={**TGI[1], "stream": True}),
    ):
        ids.add(response.headers["X-Request-Id"])
        assert len(response.headers["X-Request-Id"]) == 32
    assert len(ids) == 6


def test_an_unhandled_error_still_carries_the_request_id_and_is_counted():
    class Broken(FakeTriton):
        async def stream(self, model, inputs, outputs=None):
            raise RuntimeError("bug")
            yield

    c = client(Broken())
    r = c.post("/v1/completions", json=COMPLETION[1], headers={"X-Request-Id": "boom"})
    assert r.status_code == 500 and r.headers["X-Request-Id"] == "boom"
    assert r.json()["error"]["message"] == "internal server error"
    assert 'route="/v1/completions",status="500"' in c.get("/metrics").text


def test_request_id_goes_to_triton_on_streams():
    async def scenario():
        fake = FakeAioClient([grpc_response([5], final=True)])
        token = open_record(RequestRecord("abc-123", "POST", "/"))
        try:
            async for _ in TritonClient("-", client=fake).stream(ENSEMBLE, {"text_input": np.array([b"Hi"])}):
                pass
        finally:
            close_record(token)
        return fake._client_stub.call.request

    assert asyncio.run(scenario()).id == "abc-123"


# ---------------------------------------------------------------------------------------------
# Metrics and the access log


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_metrics_count_requests_refusals_streams_and_token_latencies():
    c = client()
    c.post("/", json=TGI[1])
    c.post("/", json={**TGI[1], "stream": True})
    c.post("/v1/completions", json={**COMPLETION[1], "stream": True})
    busy = client(FakeTriton(error=APIError(429, "engine queue full")))
    assert busy.post("/", json=TGI[1]).status_code == 429
    text = c.get("/metrics").text
    assert metric(text, 'tritonlm_frontend_requests_total{method="POST",route="/",status="200"}') == 2
    assert metric(text, 'tritonlm_frontend_time_to_first_token_seconds_count{route="/"}') == 2
    # HELLO: 3 responses with tokens, so 2 gaps per sequence
    assert metric(text, 'tritonlm_frontend_inter_token_latency_seconds_count{route="/"}') == 4
    assert metric(text, 'tritonlm_frontend_generation_tokens_total{route="/v1/completions"}') == 4
    assert metric(text, "tritonlm_frontend_streams_open") == 0
    refused = busy.get("/metrics").text
    assert metric(refused, 'tritonlm_frontend_requests_refused_total{route="/",status="429"}') == 1


def test_streams_open_counts_a_stream_while_it_runs():
    import httpx

    app = create_app(FrontendConfig(served_model_name="default"), triton=FakeTriton(delay=0.3))

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            stream = asyncio.ensure_future(http.post("/", json={**TGI[1], "stream": True}))
            await asyncio.sleep(0.45)  # headers went out after the first response (0.3 s)
            during = metric((await http.get("/metrics")).text, "tritonlm_frontend_streams_open")
            await stream
            after = metric((await http.get("/metrics")).text, "tritonlm_frontend_streams_open")
            return during, after

    assert asyncio.run(scenario()) == (1, 0)


def test_access_log_has_one_line_per_request_with_id_route_status_tokens_and_times(caplog):
    c = client()
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        c.post("/v1/completions", json=COMPLETION[1], headers={"X-Request-Id": "log-me"})
        c.post("/", json={"inputs": ""})
    lines = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 2
    first = lines[0]
    assert first.request_id == "log-me" and first.route == "/v1/completions" and first.status == 200
    assert first.tokens_in == 4 and first.tokens_out == 4 and first.ttft_ms >= 0 and first.duration_ms > 0
    assert "status=200" in first.getMessage() and "tokens_out=4" in first.getMessage()
    assert lines[1].status == 422 and lines[1].ttft_ms is None
    # JSON lines: the fields, and the request id the filter adds
    RequestIdFilter().filter(first)
    entry = json.loads(JsonFormatter().format(first))
    assert entry["logger"] == ACCESS_LOGGER and entry["status"] == 200 and entry["tokens_in"] == 4
    assert entry["request_id"] == "log-me"


def test_json_formatter_tags_lines_with_the_current_request_id():
    token = open_record(RequestRecord("rid-7", "POST", "/"))
    try:
        record = logging.LogRecord("frontend.x", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
        RequestIdFilter().filter(record)
    finally:
        close_record(token)
    entry = json.loads(JsonFormatter().format(record))
    assert entry == {**entry, "request_id": "rid-7", "message": "failed here", "level": "ERROR"}


# ---------------------------------------------------------------------------------------------
# Settings and OpenAPI


def test_settings_from_env_and_flags(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("-")
    env = {"API_KEY": "a, b,", "MAX_REQUEST_BODY_BYTES": "1000", "LOG_FORMAT": "JSON"}
    s = FrontendConfig.load([], env)
    assert s.api_keys == ("a", "b") and s.max_body_bytes == 1000 and s.log_format == "json" and not s.tls
    args = ["--api-key", "z", "--ssl-certfile", str(cert), "--ssl-keyfile", str(cert)]
    s = FrontendConfig.load(args, env)
    assert s.api_keys == ("z",) and s.max_body_bytes == 1000 and s.tls
    for bad, words in (
        ({"MAX_REQUEST_BODY_BYTES": "lots"}, "MAX_REQUEST_BODY_BYTES"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
        ({"SSL_CERTFILE": str(cert)}, "together"),
        ({"SSL_CERTFILE": "/no", "SSL_KEYFILE": "/no"}, "no such file"),
        ({"SSL_CA_CERTS": str(cert)}, "needs SSL_CERTFILE"),
    ):
        with pytest.raises(ConfigError, match=words):
            FrontendConfig.load([], bad)


def test_openapi_documents_each_routes_error_statuses_and_bodies():
    spec = client().get("/openapi.json").json()
    paths = spec["paths"]

    def codes(path, method="post"):
        return sorted(int(c) for c in paths[path][method]["responses"] if c != "200")

    assert codes("/") == [400, 401, 413, 422, 429, 503]  # 400: media content parts
    for path in ("/v1/chat/completions", "/v1/completions", "/serving-endpoints/{name}/invocations"):
        assert codes(path) == [400, 401, 404, 413, 429, 503]
    assert codes("/v1/embeddings") == [400, 401, 404, 413, 503]
    assert codes("/health", "get") == [503] and codes("/metrics", "get") == []
    ref = paths["/v1/completions"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert ref == {"$ref": "#/components/schemas/OpenAIError"}
    tgi = paths["/"]["post"]["responses"]["422"]["content"]["application/json"]["schema"]
    assert tgi == {"$ref": "#/components/schemas/TGIError"}
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_hello_fixture_is_what_the_counts_assume():
    assert sum(len(r["output_ids"].reshape(-1)) for r in HELLO) == 4


def test_a_body_that_is_not_utf8_is_a_bad_request_in_each_api_format():
    c = client()
    garbage = {"content": b"\x07\xff\x0b", "headers": {"Content-Type": "application/json"}}
    r = c.post("/", **garbage)
    assert r.status_code == 422 and r.json()["error_type"] == "validation"
    r = c.post("/v1/completions", **garbage)
    assert r.status_code == 400 and "could not be parsed" in r.json()["error"]["message"]
