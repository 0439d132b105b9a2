"""OpenTelemetry tracing: off unless the standard OTEL_* variables turn it on; then one SERVER span per
HTTP request (`TracingMiddleware`, continuing a client's W3C `traceparent`), whose children are the
request's Triton calls (`frontend.engine_client.traced`), exported in batches over OTLP.

Off costs nothing: the app then adds neither the middleware nor the Triton wrapper, and the SDK is
never imported (only the API is, which is installed anyway and does nothing without a provider).

On when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER is set,
unless OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. This module reads only those and the OTLP
protocol; the SDK reads the rest itself (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
OTEL_TRACES_SAMPLER[_ARG], the exporter's endpoint, headers, timeout, compression and certificates,
OTEL_BSP_*), and the API reads OTEL_PROPAGATORS (default: W3C tracecontext and baggage).
Spans and attributes: docs/operations.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontend.ops.context import current, route_of
from tritonlm.settings import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

TRACER_NAME = "tritonlm.frontend"
SERVICE_NAME = "tritonlm-frontend"  # unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names one
REQUEST_ID = "tritonlm.request.id"  # the request's X-Request-Id, on its every span
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_EXPORTERS = ("otlp", "console", "none")
_PROTOCOLS = ("http/protobuf", "grpc")
UNTRACED = ("/health", "/metrics")  # probes and scrapes: every few seconds, nothing to follow


def exporters_wanted(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The span exporters (otlp, console) the OTEL_* variables ask for; none: tracing is off.
    A value we cannot honour is a ConfigError naming its variable."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    for name in names:
        if name not in _EXPORTERS:
            raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not one of {', '.join(_EXPORTERS)}")
    if not names and any(environ.get(v, "").strip() for v in _ENDPOINTS):
        names = ["otlp"]  # the spec's default exporter, once an endpoint says where to
    if "otlp" in names:
        otlp_protocol(environ)  # checked before anything starts
    return [n for n in names if n != "none"]


def otlp_protocol(environ: Mapping[str, str]) -> str:
    variable = next(
        (v for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") if environ.get(v)),
        None,
    )
    protocol = environ[variable].strip().lower() if variable else "http/protobuf"  # the spec's default
    if protocol not in _PROTOCOLS:
        raise ConfigError(f"{variable}: {protocol!r} is not one of {', '.join(_PROTOCOLS)}")
    return protocol


def provider_from_env(environ: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """The tracer provider the OTEL_* variables ask for, exporting through a BatchSpanProcessor;
    None when tracing is off."""
    names = exporters_wanted(environ)
    if not names:
        return None
    # Only now the SDK: a server without tracing never imports it.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER[_ARG]
    for name in names:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))  # OTEL_BSP_*
    return provider


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if otlp_protocol(environ) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # its endpoint: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or …_ENDPOINT/v1/traces


def triton_trace_flags(environ: Mapping[str, str] = os.environ) -> list[str]:
    """tritonserver's flags for its own OpenTelemetry tracing, when ours exports over OTLP/HTTP (the
    one protocol Triton speaks), to the same endpoint: Triton traces every request whose gRPC
    metadata carries a traceparent (the frontend sends one for the spans its sampler keeps), its spans
    children of the frontend's, and with `rate=0` no other request (a gRPC client's without one).
    None when tracing is off or exports otherwise."""
    if "otlp" not in exporters_wanted(environ) or otlp_protocol(environ) != "http/protobuf":
        return []
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if not endpoint:
        base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
        endpoint = base.rstrip("/") + "/v1/traces"
    return [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=0",
        "--trace-config=count=-1",
        f"--trace-config=opentelemetry,url={endpoint}",
    ]


def mark_failed(span: trace.Span, error: BaseException) -> None:
    """`span` ended in `error`: status ERROR with the client's message, `error.type` the HTTP status
    an APIError carries (else the exception's class), the exception as an event."""
    if not span.is_recording():
        return
    status = getattr(error, "status", None)  # an APIError's HTTP status, and its client's message
    if isinstance(status, int):
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR, str(error)))
    else:
        span.set_attribute("error.type", type(error).__qualname__)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.record_exception(error)


def note_error(error: Exception) -> None:
    """The request's error response, on its span (the one error handler calls this; a no-op when
    tracing is off or outside a request)."""
    mark_failed(trace.get_current_span(), error)


def trace_headers() -> dict[str, str] | None:
    """The current span's context as W3C headers (`traceparent`), for Triton's gRPC metadata: Triton
    continues the trace when its own OpenTelemetry tracing is on (and traces every request that
    carries one). None outside a span the sampler kept."""
    if not trace.get_current_span().get_span_context().trace_flags.sampled:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def trace_id() -> str:
    """The current trace's id in hex, for log lines; "" outside a span the sampler kept."""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.trace_flags.sampled else ""


class TracingMiddleware:
    """A SERVER span per HTTP request (but probes and scrapes), inside the request-id middleware (its
    id is an attribute), current while the request runs, so the Triton calls' spans are its children.
    HTTP attributes after OpenTelemetry's HTTP conventions; a response of 400 or more marks the span
    ERROR with `error.type` its status (the message, when the error handler saw one)."""

    def __init__(self, app: ASGIApp, tracer: trace.Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNTRACED:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        parent = propagate.extract(headers)  # the client's traceparent: its trace continues
        span = self.tracer.start_span(
            scope["method"],
            context=parent,
            kind=SpanKind.SERVER,
            attributes=_request_attributes(scope, headers),
        )
        status = 500  # unless a response starts

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        token = context.attach(trace.set_span_in_context(span, parent))
        try:
            await self.app(scope, receive, watch)
        except Exception as error:
            mark_failed(span, error)
            raise
        finally:
            context.detach(token)
            _finish(span, scope, status)


def _request_attributes(scope: Scope, headers: Headers) -> dict[str, str]:
    record = current()
    attributes = {
        "http.request.method": scope["method"],
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
        REQUEST_ID: record.request_id if record is not None else "",
    }
    if scope.get("client"):
        attributes["client.address"] = scope["client"][0]
    if "user-agent" in headers:
        attributes["user_agent.original"] = headers["user-agent"]
    return attributes


def _finish(span: trace.Span, scope: Scope, status: int) -> None:
    route = route_of(scope)
    if route != "unmatched":
        span.update_name(f"{scope['method']} {route}")
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 400 and span.is_recording() and span.status.is_unset:  # the handler's message wins
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
    span.end()
