"""Operations against the live servers: API keys and TLS (a frontend started with them, on the session's
tritonserver), request ids reaching Triton, JSON access logs, /metrics, the body limit, and a
bounded schemathesis run of /openapi.json (no 5xx, every status documented)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import httpx
import numpy as np
import pytest
from conftest import Servers, free_port
from prometheus_client.parser import text_string_to_metric_families

import frontend.engine_client.triton as triton_module
import launcher
from client.bench import engine_stats
from frontend.engine_client.triton import TritonClient
from frontend.errors import APIError
from frontend.ops.context import RequestRecord, close_record, open_record
from tritonlm.config import EngineConfig

KEY = "sk-test-0123456789"
COMPLETION = {"model": "tiny", "prompt": "Hello", "max_tokens": 4}


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for localhost and its key, made with the openssl CLI."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def trusting(cert: Path, client: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A client context that trusts `cert` and presents `client` (certificate, key) if given."""
    context = ssl.create_default_context(cafile=str(cert))
    if client is not None:
        context.load_cert_chain(*map(str, client))
    return context


class Frontend:
    def __init__(self, url: str, log: Path, cert: Path):
        self.url, self.log, self.cert = url, log, cert

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, verify=trusting(self.cert), timeout=60)

    def access_lines(self) -> list[dict]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.startswith("{")]
        return [entry for entry in lines if entry["logger"] == "tritonlm.access"]


@pytest.fixture(scope="module")
def tls_frontend(servers: Servers, tmp_path_factory) -> Iterator[Frontend]:
    """A second frontend on the session's tritonserver: HTTPS, API keys, JSON logs, the launcher's
    own start and readiness check."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test certificate")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(directory, "server")
    ports = launcher.Ports(frontend=free_port(), grpc=servers.ports.grpc)
    env = {
        "API_KEY": f"other-key,{KEY}",
        "SSL_CERTFILE": str(cert),
        "SSL_KEYFILE": str(key),
        "LOG_FORMAT": "json",
    }
    log = directory / "frontend.log"
    with mock.patch.dict(os.environ, env):
        process = launcher.start_frontend(ports, "tiny", log, model_dir=servers.model_dir)
        try:
            url, context = launcher.frontend_health(ports)
            assert url.startswith("https://")
            launcher.wait_ready(url, process, 60, "frontend", context=context)
            yield Frontend(f"https://localhost:{ports.frontend}", log, cert)
        finally:
            launcher.stop(process)


def test_https_with_an_api_key_serves_generations(tls_frontend: Frontend):
    with tls_frontend.client() as http:
        r = http.post("/v1/completions", json=COMPLETION, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert http.get("/health").status_code == 200  # open without a key
        assert http.get("/metrics").status_code == 200


@pytest.mark.parametrize(
    "path, body",
    [
        ("/", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}),
        ("/v1/completions", COMPLETION),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/responses", {"model": "tiny", "input": "Hi"}),
        ("/v1/embeddings", {"input": "Hi"}),
        ("/serving-endpoints/tiny/invocations", {"prompt": "Hi"}),
    ],
)
def test_every_api_refuses_a_missing_or_wrong_key_with_401_in_its_format(tls_frontend: Frontend, path, body):
    with tls_frontend.client() as http:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
            r = http.post(path, json=body, headers=headers)
            assert r.status_code == 401
            error = r.json()["error"]
            if path == "/":
                assert r.json()["error_type"] == "authentication" and "API key" in error
            else:
                assert error["code"] == "invalid_api_key" and "API key" in error["message"]


def test_plain_http_is_not_served_on_the_tls_port(tls_frontend: Frontend):
    with pytest.raises(httpx.HTTPError):
        httpx.get(tls_frontend.url.replace("https", "http") + "/health", timeout=5)


def test_json_access_log_has_the_request_id_route_status_tokens_and_times(tls_frontend: Frontend):
    with tls_frontend.client() as http:
        body = {**COMPLETION, "stream": True}
        headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": "json-log-test-1"}
        with http.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            assert r.headers["X-Request-Id"] == "json-log-test-1"
            assert "[DONE]" in r.read().decode()
    deadline = time.monotonic() + 5
    while not (entries := [e for e in tls_frontend.access_lines() if e["request_id"] == "json-log-test-1"]):
        assert time.monotonic() < deadline, "no access line"
        time.sleep(0.1)
    (entry,) = entries
    assert entry["route"] == "/v1/completions" and entry["status"] == 200 and entry["tokens_out"] == 4
    assert entry["tokens_in"] > 0 and 0 < entry["ttft_ms"] <= entry["duration_ms"]


def test_client_certificates_are_required_with_a_ca(servers: Servers, tmp_path: Path):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test certificate")
    cert, key = self_signed(tmp_path, "server")
    client_cert, client_key = self_signed(tmp_path, "client")  # self-signed: its own CA
    ports = launcher.Ports(frontend=free_port(), grpc=servers.ports.grpc)
    env = {"SSL_CERTFILE": str(cert), "SSL_KEYFILE": str(key), "SSL_CA_CERTS": str(client_cert)}
    with mock.patch.dict(os.environ, env):
        process = launcher.start_frontend(
            ports, "tiny", tmp_path / "frontend.log", model_dir=servers.model_dir
        )
        try:
            health_url, context = launcher.frontend_health(ports)
            # up, though it refuses us
            launcher.wait_ready(health_url, process, 60, "frontend", context=context)
            url = f"https://localhost:{ports.frontend}/health"
            assert httpx.get(url, verify=trusting(cert, (client_cert, client_key))).status_code == 200
            with pytest.raises(httpx.HTTPError):
                httpx.get(url, verify=trusting(cert))
        finally:
            launcher.stop(process)


# ---------------------------------------------------------------------------------------------
# On the session's frontend (no keys, no TLS)


def test_request_ids_are_returned_and_reach_triton(servers: Servers, monkeypatch):
    r = httpx.post(
        servers.frontend_url + "/v1/completions", json=COMPLETION, headers={"X-Request-Id": "e2e-7"}
    )
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "e2e-7"
    # Triton names the id in its own error messages: proof that it received it.
    raw: list[str] = []
    classify = triton_module.classify_error
    monkeypatch.setattr(triton_module, "classify_error", lambda m: (raw.append(m), classify(m))[1])

    async def bad_request() -> None:
        token = open_record(RequestRecord("e2e-triton-id", "POST", "/"))
        client = TritonClient(servers.grpc_url)
        try:
            await client.infer("preprocessing", {"text_input": np.array([[b"x"]], dtype=object)})
        finally:
            close_record(token)
            await client.close()

    with pytest.raises(APIError):
        asyncio.run(bad_request())
    assert "[request id: e2e-triton-id]" in raw[0]


def test_frontend_metrics_count_requests_and_token_latencies(servers: Servers):
    url = servers.frontend_url
    body = {"inputs": "Hi", "parameters": {"max_new_tokens": 5}, "stream": True}
    assert "data:" in httpx.post(url + "/", json=body, timeout=60).text
    text = httpx.get(url + "/metrics").text

    def value(prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))

    assert value('tritonlm_frontend_requests_total{method="POST",route="/",status="200"}') >= 1
    assert value('tritonlm_frontend_time_to_first_token_seconds_count{route="/"}') >= 1
    assert value('tritonlm_frontend_inter_token_latency_seconds_count{route="/"}') >= 4
    assert value("tritonlm_frontend_streams_open") == 0
    assert "tritonlm_engine" not in text  # the engine's metrics stay on Triton's port
    assert "tritonlm_engine" in httpx.get(servers.metrics_url).text


def vllm_series(servers: Servers) -> dict[str, tuple[dict[str, str], float]]:
    """The frontend's vllm:* series of the served model: name -> (labels, value)."""
    text = httpx.get(servers.frontend_url + "/metrics", timeout=30).text
    return {
        s.name: (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        if family.name.startswith("vllm:")
        for s in family.samples
        if s.labels["model_name"] == servers.model_name
    }


LOAD_SERIES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv": "vllm:kv_cache_usage_perc",
}


def test_the_vllm_series_gateways_read_follow_the_engine_under_load(servers: Servers):
    """More streams than the engine runs at once (max_num_seqs): they run, the rest wait, the KV
    cache fills; closed, everything returns to idle. The settings as the engine publishes them."""
    engine = engine_stats(servers.metrics_url)
    labels, value = vllm_series(servers)["vllm:cache_config_info"]
    assert value == 1 and labels["block_size"] == str(EngineConfig().block_size)  # not set: the default
    assert labels["num_gpu_blocks"] == str(int(engine["kv_blocks_total"]))
    assert labels["enable_prefix_caching"] == "True"
    batch = EngineConfig().max_num_seqs  # the test servers' (not set: the default)
    stop = threading.Event()

    def stream() -> None:
        body = {
            "model": servers.model_name,
            "prompt": "Hello",
            "max_tokens": 1500,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", servers.frontend_url + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return  # leaving closes the stream: the engine cancels the request

    threads = [threading.Thread(target=stream) for _ in range(batch + 2)]
    seen: dict[str, float] = {}
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while not (seen.get("waiting", 0) >= 1 and seen.get("running", 0) == batch and seen.get("kv", 0) > 0):
            assert time.monotonic() < deadline, f"the series never showed a full batch: {seen}"
            series = vllm_series(servers)
            for key, name in LOAD_SERIES.items():
                seen[key] = max(seen.get(key, 0), series[name][1])
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert 0 < seen["kv"] <= 1
    deadline = time.monotonic() + 60
    while True:  # the cancelled requests leave the engine within a second or so
        series = vllm_series(servers)
        idle = [series[n][1] for n in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
        if idle == [0, 0] and series["vllm:kv_cache_usage_perc"][1] < 0.01:
            break
        assert time.monotonic() < deadline, f"not back to idle: {series}"
        time.sleep(0.5)
    labels, value = series["vllm:lora_requests_info"]
    assert labels["running_lora_adapters"] == labels["waiting_lora_adapters"] == ""  # none here
    assert abs(value - time.time()) < 60 and int(labels["max_lora"]) >= 1


def test_body_limit_and_the_4mb_prompt_limit(servers: Servers):
    url = servers.frontend_url
    prompt = "a" * (4 * 1024 * 1024 + 1)  # one character over the APIs' 4 MB limit: 400 naming prompt
    r = httpx.post(url + "/v1/completions", json={**COMPLETION, "prompt": prompt}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(url + "/", content=b"x" * (32 * 1024 * 1024 + 1), timeout=60)  # the default body limit
    assert r.status_code == 413 and r.json()["error_type"] == "payload_too_large"


def test_fuzzing_the_openapi_schema_finds_no_server_error_and_no_undocumented_status(
    servers: Servers, tmp_path: Path
):
    """Bounded: a fixed seed, few examples per operation, about a minute and a quarter here. The
    coverage phase runs its invalid boundary cases only: its valid ones (1,700 generations, 100 s
    here) are left to `make fuzz`, which runs every phase in both modes; the fuzzing phase still
    sends valid requests to every operation."""
    st = Path(sys.executable).parent / "st"
    for phases in (["--phases", "coverage", "--mode", "negative"], ["--phases", "examples,fuzzing,stateful"]):
        command = [
            str(st), "run", f"{servers.frontend_url}/openapi.json",
            "--checks", "not_a_server_error,status_code_conformance",
            "--max-examples", "25", "--workers", "2", "--request-timeout", "120", "--seed", "20261122",
            "--no-color", *phases,
        ]  # fmt: skip
        run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
