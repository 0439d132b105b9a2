"""The frontend's Prometheus metrics, `GET /metrics`: what clients get, as the frontend sends it.

Triton's metrics port keeps the engine's own (tritonlm_engine, …); these are measured at the HTTP
side: requests by route and status, refusals (429 queue full, 503 not serving), streams open, and
per generated token the time to first token and the gaps between tokens, from the moment the
request arrived to the moment each token reached the frontend for sending.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontend.ops.context import current, route_of

# Latency buckets (seconds): a CPU server's token gaps are tens of ms, a long prompt's TTFT seconds.
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5)
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
REFUSED = (429, 503)
disable_created_metrics()  # no `_created` series: they double the output and no dashboard reads them


class FrontendMetrics:
    """One registry per app (tests build several apps in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tritonlm_frontend_requests", "HTTP requests answered", ["route", "method", "status"], registry=r
        )
        self.refused = Counter(
            "tritonlm_frontend_requests_refused",
            "requests refused: 429 (engine queue full) or 503 (Triton not serving)",
            ["route", "status"],
            registry=r,
        )
        self.duration = Histogram(
            "tritonlm_frontend_request_duration_seconds",
            "arrival to the end of the response (streams: the last event)",
            ["route"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "tritonlm_frontend_time_to_first_token_seconds",
            "request arrival to its first generated token",
            ["route"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "tritonlm_frontend_inter_token_latency_seconds",
            "gap between successive token-carrying responses of a sequence",
            ["route"],
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.streams_open = Gauge("tritonlm_frontend_streams_open", "SSE responses in progress", registry=r)
        self.prompt_tokens = Counter(
            "tritonlm_frontend_prompt_tokens", "prompt tokens", ["route"], registry=r
        )
        self.generation_tokens = Counter(
            "tritonlm_frontend_generation_tokens", "generated tokens sent", ["route"], registry=r
        )

    def response(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: FrontendMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        m = self.metrics
        status = 500  # unless a response starts
        streaming = False
        started = time.monotonic()

        async def observe(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                kind = Headers(raw=message.get("headers", [])).get("content-type", "")
                if kind.startswith("text/event-stream"):
                    streaming = True
                    m.streams_open.inc()
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            if streaming:
                m.streams_open.dec()
            route = route_of(scope)
            m.requests.labels(route, scope["method"], str(status)).inc()
            m.duration.labels(route).observe(time.monotonic() - started)
            if status in REFUSED and route != "/health":  # a probe's 503 refuses nobody
                m.refused.labels(route, str(status)).inc()
            record = current()
            if record is not None:
                if record.ttft is not None:
                    m.ttft.labels(route).observe(record.ttft)
                for gap in record.token_gaps:
                    m.itl.labels(route).observe(gap)
                if record.tokens_in:
                    m.prompt_tokens.labels(route).inc(record.tokens_in)
                if record.tokens_out:
                    m.generation_tokens.labels(route).inc(record.tokens_out)
