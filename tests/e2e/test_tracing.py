"""OpenTelemetry tracing end to end: a frontend beside the session's tritonserver, turned on by
OTEL_EXPORTER_OTLP_ENDPOINT alone, exports its spans over OTLP/HTTP to a collector in this test (a
plain HTTP server that decodes the protobuf bodies POSTed to /v1/traces): a request's span with its
Triton calls as children, the request id and the engine's token counts as attributes, a client's trace
continued, a bad request marked. The spans' details without a server: tests/frontend/test_tracing_unit.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from conftest import Servers, frontend_beside
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

SERVICE = "tritonlm-e2e"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
WAIT_SECONDS = 60  # the batch processor exports every 100 ms here; the machine may be loaded


@dataclass
class Exported:
    service: str
    span: Span

    @property
    def attributes(self) -> dict:
        return {kv.key: value(kv.value) for kv in self.span.attributes}


def value(v: AnyValue):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(item) for item in v.array_value.values]
    return getattr(v, kind)


class Collector:
    """Records the spans of every OTLP/HTTP export POSTed to /v1/traces."""

    def __init__(self) -> None:
        self.spans: list[Exported] = []
        self.paths: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.paths.append(self.path)
                export = ExportTraceServiceRequest.FromString(body)
                for resource in export.resource_spans:
                    names = [
                        kv.value.string_value
                        for kv in resource.resource.attributes
                        if kv.key == "service.name"
                    ]
                    for scope in resource.scope_spans:
                        collector.spans.extend(Exported(names[0] if names else "", s) for s in scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace_of(self, request_id: str, names: set[str]) -> dict[str, Exported]:
        """The spans of the request `request_id`, once those named `names` have arrived, by name."""
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            tagged = [s for s in self.spans if s.attributes.get("tritonlm.request.id") == request_id]
            found = {s.span.name: s for s in tagged}
            if names <= found.keys():
                return found
            time.sleep(0.1)
        raise AssertionError(f"no spans {names} of {request_id} in {WAIT_SECONDS} s: {sorted(found)}")


@pytest.fixture(scope="module")
def traced(servers: Servers, tmp_path_factory) -> Iterator[tuple[str, Collector]]:
    collector = Collector()
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    try:
        with frontend_beside(servers, env, tmp_path_factory.mktemp("traced")) as url:
            yield url, collector
    finally:
        collector.server.shutdown()
        collector.server.server_close()


def chat(servers: Servers, **extra) -> dict:
    return {
        "model": servers.model_name,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
    } | extra


def check_request_and_engine(spans: dict[str, Exported], servers: Servers, usage: dict | None) -> Exported:
    request = spans["POST /v1/chat/completions"]
    engine = spans[f"text_completion {servers.model_name}"]
    assert request.service == engine.service == SERVICE
    assert request.span.kind == Span.SPAN_KIND_SERVER and engine.span.kind == Span.SPAN_KIND_CLIENT
    for child in (engine, spans["infer preprocessing"]):
        assert child.span.parent_span_id == request.span.span_id
        assert child.span.trace_id == request.span.trace_id
    assert request.attributes["http.response.status_code"] == 200
    assert engine.attributes["gen_ai.request.model"] == servers.model_name
    assert engine.attributes["gen_ai.request.max_tokens"] == 4
    assert engine.attributes["gen_ai.response.finish_reasons"]
    if usage is not None:
        assert engine.attributes["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
        assert engine.attributes["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    return request


def test_a_chat_completion_exports_its_span_with_the_engine_call_as_a_child(traced, servers):
    url, collector = traced
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    r = httpx.post(url + "/v1/chat/completions", json=chat(servers), headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    request_id = r.headers["X-Request-Id"]
    names = {"POST /v1/chat/completions", f"text_completion {servers.model_name}", "infer preprocessing"}
    spans = collector.trace_of(request_id, names)
    request = check_request_and_engine(spans, servers, r.json()["usage"])
    assert request.span.trace_id.hex() == TRACE_ID and request.span.parent_span_id.hex() == CLIENT_SPAN
    assert set(collector.paths) == {"/v1/traces"}


def test_a_streamed_chat_completion_too(traced, servers):
    url, collector = traced
    body = chat(servers, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert text.rstrip().endswith("data: [DONE]")
    names = {"POST /v1/chat/completions", f"text_completion {servers.model_name}", "infer preprocessing"}
    spans = collector.trace_of(r.headers["X-Request-Id"], names)
    request = check_request_and_engine(spans, servers, None)
    assert not request.span.parent_span_id  # no traceparent: a trace of its own


def test_a_bad_request_marks_its_span(traced, servers):
    url, collector = traced
    r = httpx.post(url + "/v1/chat/completions", json=chat(servers, temperature=-1), timeout=120)
    assert r.status_code == 400
    request = collector.trace_of(r.headers["X-Request-Id"], {"POST /v1/chat/completions"})[
        "POST /v1/chat/completions"
    ]
    assert (
        request.span.status.code == Status.STATUS_CODE_ERROR and "temperature" in request.span.status.message
    )
    assert request.attributes["http.response.status_code"] == 400
    assert request.attributes["error.type"]
