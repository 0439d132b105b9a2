"""Operations around the APIs: API keys, request ids, body limit, metrics, access logs, tracing, and
the error statuses in /openapi.json. `install` plugs them all into the app; their settings are
`frontend.config.FrontendConfig`'s."""

from __future__ import annotations

from fastapi import FastAPI, Request
from opentelemetry.trace import Tracer
from starlette.responses import Response

from frontend.admin import is_admin_path
from frontend.config import FrontendConfig
from frontend.ops.access_log import AccessLogMiddleware
from frontend.ops.auth import ApiKeyMiddleware
from frontend.ops.gateway_metrics import GatewayMetrics
from frontend.ops.gateway_metrics import sources as gateway_sources
from frontend.ops.guard import ErrorGuardMiddleware
from frontend.ops.limits import BodyLimitMiddleware
from frontend.ops.metrics import FrontendMetrics, MetricsMiddleware
from frontend.ops.openapi import document_errors
from frontend.ops.request_id import RequestIdMiddleware
from frontend.ops.tracing import TracingMiddleware


def install(app: FastAPI, settings: FrontendConfig, tracer: Tracer | None = None) -> None:
    """Add the middlewares (outermost first: request id, the request's span with `tracer`, access log,
    metrics, API keys, body limit, error guard), `GET /metrics`, and the documented error statuses."""
    app.state.ops = settings
    app.state.metrics = metrics = FrontendMetrics()
    # vLLM's series for inference gateways, read from the engines at each scrape.
    gateway = GatewayMetrics(lambda: gateway_sources(app.state, settings), metrics.registry)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def frontend_metrics(request: Request) -> Response:
        """The frontend's Prometheus metrics, and the engines' state under vLLM's names (the
        `vllm:*` series inference gateways read); Triton's metrics port has the engines' own."""
        await gateway.refresh()
        return request.app.state.metrics.response()

    # add_middleware puts each one outside the ones added before it.
    app.add_middleware(ErrorGuardMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_keys:
        # The admin routes check their own key (frontend/admin).
        admin = is_admin_path if settings.admin_api_key else None
        app.add_middleware(ApiKeyMiddleware, keys=settings.api_keys, own_key=admin)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(AccessLogMiddleware)
    if tracer is not None:  # tracing off: not even a pass-through
        app.add_middleware(TracingMiddleware, tracer=tracer)
    app.add_middleware(RequestIdMiddleware)
    document_errors(app)
