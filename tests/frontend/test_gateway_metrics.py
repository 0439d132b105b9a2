"""The vLLM-named series inference gateways read on the frontend's /metrics (frontend/ops/gateway_metrics),
from real Triton metrics text: two engines in one tritonserver (MODEL_DIRS tiny and other, two
sequences at most each), three streams on `tiny` with the LoRA adapter `alpha` (two running, one
waiting) and one on `other`. The live server's series under load are tested in tests/e2e/test_ops.py."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from test_frontend_unit import FakeTriton

from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.engine_client.lora import RuntimeAdapter
from frontend.ops.gateway_metrics import Sources, families, sources
from tritonlm.lora.format import task_adapter_name
from tritonlm.serving.engine_gauges import read_engine_gauges

TEXT = (Path(__file__).parent / "data" / "triton_metrics_two_engines.txt").read_text()
TINY = Path(__file__).resolve().parents[2] / "models" / "tiny"
SOURCES = Sources((), {"engine": "tiny", "other__engine": "other"}, {})
NOW = 1_800_000_000.0


def samples(metric_families) -> dict[tuple[str, str], tuple[dict[str, str], float]]:
    """(series name, model_name) -> (labels, value)."""
    return {(s.name, s.labels["model_name"]): (s.labels, s.value) for f in metric_families for s in f.samples}


def test_the_engines_gauges_are_read_per_engine_from_tritons_text():
    engines = read_engine_gauges(TEXT)
    assert set(engines) == {"engine", "other__engine"}  # labelled by engine: no shared gauge
    tiny, other = engines["engine"], engines["other__engine"]
    assert (tiny.stats["running"], tiny.stats["waiting"], other.stats["running"]) == (2, 1, 1)
    assert tiny.stats["block_size"] == 16 and tiny.stats["kv_blocks_total"] == 512
    assert tiny.adapters == {"running": {"alpha": 2}, "waiting": {"alpha": 1}}
    assert other.adapters == {"running": {}, "waiting": {}}


def test_each_served_model_gets_vllms_series_with_its_name():
    got = samples(families([read_engine_gauges(TEXT)], SOURCES, NOW))
    assert got["vllm:num_requests_running", "tiny"][1] == 2
    assert got["vllm:num_requests_waiting", "tiny"][1] == 1
    assert got["vllm:num_requests_running", "other"][1] == 1
    assert got["vllm:num_requests_waiting", "other"][1] == 0
    assert got["vllm:kv_cache_usage_perc", "tiny"][1] == 80 / 512
    assert got["vllm:kv_cache_usage_perc", "other"][1] == 94 / 512
    labels, value = got["vllm:cache_config_info", "tiny"]
    assert value == 1 and labels["block_size"] == "16" and labels["num_gpu_blocks"] == "512"
    assert labels["enable_prefix_caching"] == "True"
    labels, value = got["vllm:lora_requests_info", "tiny"]
    assert value == NOW and labels["max_lora"] == "17"  # alpha + the task-id cache's 16
    assert labels["running_lora_adapters"] == labels["waiting_lora_adapters"] == "alpha"
    labels, _ = got["vllm:lora_requests_info", "other"]
    assert labels["running_lora_adapters"] == labels["waiting_lora_adapters"] == ""


def test_replicas_add_up_and_adapters_go_by_the_names_clients_send():
    task = "task 9223372036854775809"  # an adapter loaded at run time, sent by task id
    second = read_engine_gauges(
        TEXT.replace(
            'adapter="alpha",model="engine",state="running"',
            f'adapter="{task}",model="engine",state="running"',
        )
    )
    sources = Sources((), SOURCES.models, {task: "mine"})
    got = samples(families([read_engine_gauges(TEXT), second], sources, NOW))
    assert got["vllm:num_requests_running", "tiny"][1] == 4
    assert got["vllm:kv_cache_usage_perc", "tiny"][1] == 160 / 1024
    assert got["vllm:cache_config_info", "tiny"][0]["num_gpu_blocks"] == "1024"
    labels = got["vllm:lora_requests_info", "tiny"][0]
    assert labels["running_lora_adapters"] == "alpha,mine" and labels["waiting_lora_adapters"] == "alpha"


def test_a_model_no_replica_reports_has_no_series():
    got = samples(families([read_engine_gauges(TEXT)], Sources((), {"gone__engine": "gone"}, {}), NOW))
    assert got == {}
    assert samples(families([], SOURCES, NOW)) == {}


# ---------------------------------------------------------------------------------------------
# The app: /metrics reads the replicas' metrics ports at each scrape


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = TEXT.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def triton_metrics() -> Iterator[int]:
    """A stand-in for Triton's metrics port serving TEXT; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class Replicas(FakeTriton):
    """A fake Triton whose replicas' metrics ports are `ports` (gRPC port + 1, the default shift)."""

    def __init__(self, *ports: int) -> None:
        super().__init__()
        self.grpc = [f"127.0.0.1:{port - 1}" for port in ports]

    def urls(self) -> list[str]:
        return self.grpc


def app_metrics(*ports: int) -> str:
    config = FrontendConfig(model_dirs=(f"tiny={TINY}", f"other={TINY}"))
    with TestClient(create_app(config, triton=Replicas(*ports))) as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    return response.text


def series(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels["model_name"]): s.value
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:")
        for s in f.samples
    }


def test_metrics_carry_the_replicas_engine_state_beside_the_frontends_own():
    with triton_metrics() as port:
        text = app_metrics(port)
    assert "tritonlm_frontend_requests_total" in text
    got = series(text)
    assert got["vllm:num_requests_running", "tiny"] == 2 and got["vllm:num_requests_running", "other"] == 1
    with triton_metrics() as first, triton_metrics() as second:
        assert series(app_metrics(first, second))["vllm:num_requests_waiting", "tiny"] == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_scrape_never_fails_or_hangs_on_a_replica_that_is_down_or_silent():
    with contextlib.closing(socket.socket()) as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        with triton_metrics() as port:
            text = app_metrics(free_port(), silent.getsockname()[1], port)
        assert time.monotonic() - started < 30  # the silent one is given up (FETCH_TIMEOUT_S)
    assert series(text)["vllm:num_requests_running", "tiny"] == 2  # the replica that answered
    assert "vllm:num_requests_running{" not in app_metrics(free_port())  # none answers: absent
    assert "tritonlm_frontend_requests_total" in app_metrics(free_port())


def test_a_replicas_metrics_port_is_its_grpc_port_shifted_as_configured():
    config = FrontendConfig(triton_grpc_port=8001, triton_metrics_port=8002)
    assert config.triton_metrics_url("tritonlm-triton:8001") == "http://tritonlm-triton:8002/metrics"
    assert config.triton_metrics_url("localhost:8101") == "http://localhost:8102/metrics"  # replica 1
    assert config.triton_metrics_url("[::1]:9001") == "http://[::1]:9002/metrics"
    shifted = FrontendConfig(triton_grpc_port=31001, triton_metrics_port=31500)
    assert shifted.triton_metrics_url("10.0.0.7:31001") == "http://10.0.0.7:31500/metrics"


def test_a_collector_that_cannot_read_its_sources_leaves_the_rest_of_metrics_whole():
    config = FrontendConfig(model_dirs=(f"tiny={TINY}",))
    triton = Replicas(9000)
    triton.grpc = ["no-port"]  # not an address: reading its metrics URL fails
    with TestClient(create_app(config, triton=triton)) as client:
        response = client.get("/metrics")
    assert response.status_code == 200 and "tritonlm_frontend_requests_total" in response.text
    assert "vllm:num_requests_running{" not in response.text


def test_sources_name_the_replicas_metrics_the_models_engines_and_the_run_time_adapters():
    config = FrontendConfig(model_dirs=(f"tiny={TINY}", f"other={TINY}"))
    app = create_app(config, triton=Replicas(8102, 8202))
    weights, lora_config = np.zeros((1, 4), np.float32), np.zeros((1, 3), np.int32)
    adapter = RuntimeAdapter("mine", "/adapters/mine", weights, lora_config)
    app.state.runtime_adapters = {"mine": adapter}
    got = sources(app.state, config)
    assert got.metrics_urls == ("http://127.0.0.1:8102/metrics", "http://127.0.0.1:8202/metrics")
    assert got.models == {"engine": "tiny", "other__engine": "other"}
    assert got.adapters == {task_adapter_name(adapter.task_id): "mine"}
