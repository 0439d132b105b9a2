"""OpenTelemetry tracing without Triton (a fake stands in): which OTEL_* variables turn it on, the
request's span and its Triton calls' spans (the SDK's in-memory exporter), W3C trace context in and out,
errors marked, and nothing at all when it is off. The live check: tests/e2e/test_tracing.py."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode
from test_frontend_unit import FakeAioClient, FakeTriton, grpc_response

from frontend.app import create_app
from frontend.config import ConfigError, FrontendConfig
from frontend.engine_client.traced import TracedTriton
from frontend.engine_client.triton import ENGINE, TritonClient
from frontend.errors import APIError
from frontend.ops import tracing
from frontend.ops.access_log import ACCESS_LOGGER, JsonFormatter, RequestIdFilter
from frontend.ops.tracing import (
    REQUEST_ID,
    TracingMiddleware,
    provider_from_env,
    trace_headers,
    triton_trace_flags,
)
from tritonlm.contract import EMBEDDING

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0.5}
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
OTEL_VARIABLES = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


class EmbeddingFakeTriton(FakeTriton):
    async def infer(self, model, inputs):
        if model != EMBEDDING:
            return await super().infer(model, inputs)
        rows = len(inputs["text"])
        return {"embedding": np.ones((rows, 8), np.float32), "token_count": np.full((rows, 1), 3, np.int32)}


def traced_client(triton=None, sampler=None) -> tuple[TestClient, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # each span exported when it ends
    config = FrontendConfig(served_model_name="m", embed_model_name="e")
    app = create_app(config, triton=triton or FakeTriton(), tracer_provider=provider)
    return TestClient(app, raise_server_exceptions=False), exporter


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {span.name: span for span in exporter.get_finished_spans()}


# ---------------------------------------------------------------------------------------------
# Which variables turn it on


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_SERVICE_NAME": "x"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"},
    ]
    + [{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}],
)
def test_tracing_is_off_unless_an_exporter_or_endpoint_is_set(clean_env, env):
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert provider_from_env() is None


def exporters(provider: TracerProvider) -> list:
    processors = provider._active_span_processor._span_processors
    assert all(isinstance(p, BatchSpanProcessor) for p in processors)
    return [p.span_exporter for p in processors]


def test_an_endpoint_turns_on_batched_otlp_http_export_with_the_sdks_own_reading(clean_env):
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    provider = provider_from_env()
    try:
        [exporter] = exporters(provider)
        assert isinstance(exporter, HttpExporter) and exporter._endpoint == "http://collector:4318/v1/traces"
        assert provider.resource.attributes["service.name"] == "tritonlm-frontend"
    finally:
        provider.shutdown()
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:9999/here")
    clean_env.setenv("OTEL_SERVICE_NAME", "my-llm")
    provider = provider_from_env()
    try:
        assert exporters(provider)[0]._endpoint == "http://traces:9999/here"
        assert provider.resource.attributes["service.name"] == "my-llm"
    finally:
        provider.shutdown()


def test_the_otlp_protocol_and_several_exporters(clean_env):
    clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    clean_env.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    provider = provider_from_env()
    try:
        kinds = [type(e).__name__ for e in exporters(provider)]
        assert isinstance(exporters(provider)[0], GrpcExporter) and kinds[1] == "ConsoleSpanExporter"
    finally:
        provider.shutdown()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "_PROTOCOL",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, "TRACES_PROTOCOL"),
    ],
)
def test_values_it_cannot_honour_are_refused_naming_the_variable(clean_env, env, named):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match=named):
        provider_from_env()


def test_tritons_own_tracing_joins_when_ours_exports_over_otlp_http(clean_env):
    assert triton_trace_flags() == []
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")
    flags = triton_trace_flags()
    assert "--trace-config=mode=opentelemetry" in flags and "--trace-config=rate=0" in flags
    assert flags[-1] == "--trace-config=opentelemetry,url=http://collector:4318/v1/traces"
    clean_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:9999/here")
    assert triton_trace_flags()[-1] == "--trace-config=opentelemetry,url=http://traces:9999/here"
    clean_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")  # Triton speaks OTLP/HTTP only
    assert triton_trace_flags() == []
    clean_env.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    clean_env.setenv("OTEL_TRACES_EXPORTER", "console")
    assert triton_trace_flags() == []


def test_the_app_flushes_its_queued_spans_when_it_stops(clean_env):
    exporter = InMemorySpanExporter()
    clean_env.setenv("OTEL_TRACES_EXPORTER", "otlp")
    clean_env.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # nothing leaves before the shutdown
    clean_env.setattr(tracing, "_exporter", lambda name, environ: exporter)
    with TestClient(create_app(FrontendConfig(served_model_name="m"), triton=FakeTriton())) as client:
        assert client.post("/", json={"inputs": "Hi"}).status_code == 200
        assert exporter.get_finished_spans() == ()
    assert {s.name for s in exporter.get_finished_spans()} == {
        "POST /",
        "infer preprocessing",
        "text_completion m",
    }


def test_off_adds_nothing_and_never_imports_the_sdk():
    app = create_app(FrontendConfig(served_model_name="m"), triton=(fake := FakeTriton()))
    assert app.state.triton is fake
    assert not any(m.cls is TracingMiddleware for m in app.user_middleware)
    script = (
        "import sys; from fastapi.testclient import TestClient; from frontend.app import create_app;"
        "from frontend.config import FrontendConfig; from test_frontend_unit import FakeTriton;"
        "c = TestClient(create_app(FrontendConfig(served_model_name='m'), triton=FakeTriton()));"
        "assert c.post('/', json={'inputs': 'Hi'}).status_code == 200;"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.sdk')], 'SDK imported'"
    )
    env = {"PATH": "", "PYTHONPATH": ":".join(sys.path)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=120)


# ---------------------------------------------------------------------------------------------
# Spans


def test_a_chat_completion_is_a_server_span_with_its_triton_calls_as_children():
    client, exporter = traced_client()
    r = client.post("/v1/chat/completions", json=CHAT, headers={"User-Agent": "tester"})
    assert r.status_code == 200, r.text
    spans = by_name(exporter)
    request, engine, pre = (
        spans["POST /v1/chat/completions"],
        spans["text_completion m"],
        spans["infer preprocessing"],
    )
    assert request.kind == SpanKind.SERVER and request.parent is None
    assert request.status.status_code == StatusCode.UNSET
    assert request.attributes[REQUEST_ID] == r.headers["X-Request-Id"]
    assert {k: request.attributes[k] for k in ("http.request.method", "http.route", "url.path")} == {
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "url.path": "/v1/chat/completions",
    }
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["user_agent.original"] == "tester"
    for child in (engine, pre):
        assert child.kind == SpanKind.CLIENT
        assert child.parent.span_id == request.context.span_id
        assert child.context.trace_id == request.context.trace_id
        assert child.attributes[REQUEST_ID] == r.headers["X-Request-Id"]
    assert pre.attributes["tritonlm.triton.model"] == "preprocessing"
    usage = r.json()["usage"]
    assert {k: v for k, v in engine.attributes.items() if k != "gen_ai.response.time_to_first_chunk"} == {
        REQUEST_ID: r.headers["X-Request-Id"],
        "tritonlm.triton.model": ENGINE,
        "gen_ai.operation.name": "text_completion",
        "gen_ai.provider.name": "tritonlm",
        "gen_ai.request.model": "m",
        "gen_ai.request.temperature": 0.5,  # the engine's tensors (the fake's preprocessing adds none)
        "gen_ai.request.top_p": 1.0,  # the API's default
        "gen_ai.usage.input_tokens": usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": usage["completion_tokens"],
        "gen_ai.response.finish_reasons": ("end_id",),
    }
    assert engine.attributes["gen_ai.response.time_to_first_chunk"] >= 0


def test_a_streamed_request_span_lasts_to_the_last_event():
    client, exporter = traced_client(FakeTriton(delay=0.05))
    with client.stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True}) as r:
        assert r.status_code == 200
        body = r.read().decode()
    assert body.rstrip().endswith("[DONE]")
    spans = by_name(exporter)
    request, engine = spans["POST /v1/chat/completions"], spans["text_completion m"]
    assert engine.parent.span_id == request.context.span_id
    assert engine.attributes["gen_ai.usage.output_tokens"] == 4
    assert request.end_time >= engine.end_time and request.attributes[REQUEST_ID] == r.headers["X-Request-Id"]


def test_a_clients_traceparent_continues_its_trace():
    client, exporter = traced_client()
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    assert client.post("/", json={"inputs": "Hi"}, headers={"traceparent": traceparent}).status_code == 200
    request = by_name(exporter)["POST /"]
    assert request.context.trace_id == int(TRACE_ID, 16)
    assert request.parent.span_id == int(PARENT_ID, 16) and request.parent.is_remote


def test_probes_and_scrapes_are_not_traced():
    client, exporter = traced_client()
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    assert exporter.get_finished_spans() == ()


def test_a_request_the_sampler_drops_exports_nothing_and_sends_triton_no_traceparent():
    seen: list[dict | None] = []

    class Recording(FakeTriton):
        async def infer(self, model, inputs):
            seen.append(trace_headers())
            return await super().infer(model, inputs)

    client, exporter = traced_client(Recording(), sampler=ALWAYS_OFF)
    assert client.post("/", json={"inputs": "Hi"}).status_code == 200
    assert exporter.get_finished_spans() == () and seen == [None]


def test_a_bad_request_marks_its_span_with_the_status_and_message():
    client, exporter = traced_client()
    r = client.post("/v1/chat/completions", json=CHAT | {"temperature": -1})
    assert r.status_code == 400
    [request] = exporter.get_finished_spans()  # refused before any Triton call
    assert request.status.status_code == StatusCode.ERROR
    assert request.attributes["error.type"] == "422"  # the APIError's; the OpenAI shape answers 400
    assert "temperature" in request.status.description
    assert request.attributes["http.response.status_code"] == 400


def test_a_404_is_named_by_its_method_alone():
    client, exporter = traced_client()
    assert client.get("/no/such/path").status_code == 404
    [request] = exporter.get_finished_spans()
    assert request.name == "GET" and "http.route" not in request.attributes
    assert request.status.status_code == StatusCode.ERROR


def test_an_engine_error_marks_the_engine_span_and_the_request_span():
    client, exporter = traced_client(FakeTriton(error=APIError(429, "engine queue full")))
    assert client.post("/v1/completions", json={"model": "m", "prompt": "Hi"}).status_code == 429
    spans = by_name(exporter)
    engine, request = spans["text_completion m"], spans["POST /v1/completions"]
    assert engine.status.status_code == StatusCode.ERROR and engine.attributes["error.type"] == "429"
    assert engine.status.description == "engine queue full"
    assert [e.name for e in engine.events] == ["exception"]
    assert request.status.status_code == StatusCode.ERROR and request.attributes["error.type"] == "429"


def test_an_error_after_the_headers_marks_the_request_span_though_its_status_was_200():
    client, exporter = traced_client(FakeTriton(error=APIError(500, "inference failed: boom"), error_after=1))
    with client.stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True}) as r:
        assert r.status_code == 200 and "boom" in r.read().decode()
    request = by_name(exporter)["POST /v1/chat/completions"]
    assert request.status.status_code == StatusCode.ERROR and "boom" in request.status.description


def test_log_lines_of_a_traced_request_carry_its_trace_id(caplog):
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    lines: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record)

    handler = Keep()
    handler.addFilter(RequestIdFilter())  # as log_config attaches it
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    try:
        client, exporter = traced_client()
        assert client.post("/", json={"inputs": "Hi"}).status_code == 200
    finally:
        logger.removeHandler(handler)
    [line] = lines
    entry = json.loads(JsonFormatter().format(line))
    assert entry["trace_id"] == format(by_name(exporter)["POST /"].context.trace_id, "032x")


def test_embeddings_are_a_genai_embeddings_span():
    client, exporter = traced_client(EmbeddingFakeTriton())
    assert client.post("/v1/embeddings", json={"input": ["a", "b"]}).status_code == 200
    span = by_name(exporter)["embeddings e"]
    assert span.attributes["gen_ai.operation.name"] == "embeddings"
    assert span.attributes["gen_ai.usage.input_tokens"] == 6
    assert span.attributes["gen_ai.embeddings.dimension.count"] == 8


def test_untraced_calls_pass_through_to_the_wrapped_triton():
    fake = FakeTriton()
    wrapped = TracedTriton(fake, trace.NoOpTracer(), str)
    assert wrapped.ready is not None and asyncio.run(wrapped.ready(())) is True
    assert wrapped.calls is fake.calls


# ---------------------------------------------------------------------------------------------
# Trace context on to Triton (its own OpenTelemetry tracing continues the trace)


def test_triton_calls_carry_the_engine_spans_traceparent():
    seen: list[dict | None] = []

    class Recording(FakeTriton):
        async def stream(self, model, inputs, outputs=None):
            seen.append(trace_headers())
            async for response in super().stream(model, inputs, outputs):
                yield response

    client, exporter = traced_client(Recording())
    assert client.post("/", json={"inputs": "Hi"}).status_code == 200
    engine = by_name(exporter)["text_completion m"]
    [headers] = seen
    assert headers["traceparent"].startswith(
        f"00-{engine.context.trace_id:032x}-{engine.context.span_id:016x}-"
    )


def test_triton_client_sends_the_current_span_context_as_grpc_metadata():
    provider = TracerProvider()
    fake = FakeAioClient([grpc_response([5], final=True)])

    async def scenario() -> None:
        with provider.get_tracer("t").start_as_current_span("s") as span:
            async for _ in TritonClient("-", client=fake).stream(ENGINE, {}):
                pass
            return span

    span = asyncio.run(scenario())
    metadata = dict(fake._client_stub.metadata)
    assert metadata["traceparent"].startswith(f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-")
    assert trace_headers() is None  # outside a span: nothing to send
