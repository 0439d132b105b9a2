"""Logging: one access line per request (id, route, status, tokens in/out, TTFT, duration), every
line of a request tagged with its id, and JSON lines with `LOG_FORMAT=json`. Uvicorn's own access
log is off (this one replaces it); its other messages go through the same handler and format."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from frontend.ops.context import current, request_id, route_of
from frontend.ops.tracing import trace_id

ACCESS_LOGGER = "tritonlm.access"
log = logging.getLogger(ACCESS_LOGGER)

# The standard LogRecord attributes; anything else on a record was passed as `extra`.
# uvicorn's `color_message` is its message with terminal colours: not for JSON.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id", "color_message"}


class RequestIdFilter(logging.Filter):
    """Tags every log record with the current request's id ("-" outside a request) and, with tracing
    on, its trace's id (`trace_id`, in JSON lines: the way from a log line to its trace)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = request_id() or "-"
        if trace := trace_id():
            record.trace_id = trace
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", "-") != "-":
            entry["request_id"] = record.request_id
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_config(log_format: str, level: str = "info") -> dict[str, Any]:
    """A logging.config.dictConfig for uvicorn.run(log_config=…): one stderr handler for all."""
    formatter = (
        {"()": JsonFormatter}
        if log_format == "json"
        else {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"}
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"default": formatter},
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "filters": ["request_id"],
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["default"], "level": level.upper()},
        "loggers": {name: {"handlers": [], "propagate": True} for name in ("uvicorn", "uvicorn.error")},
    }


# Fields the text line shows before the key=value list (the id is in every line's prefix).
_IN_PREFIX = ("request_id", "method", "path")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            record = current()
            if record is not None:
                fields = {
                    "request_id": record.request_id,
                    "method": record.method,
                    "path": record.path,
                    "route": route_of(scope),
                    "status": record.status or 500,
                    "tokens_in": record.tokens_in,
                    "tokens_out": record.tokens_out,
                    "ttft_ms": _ms(record.ttft),
                    "duration_ms": _ms(time.monotonic() - started),
                }
                text = " ".join(f"{k}={v}" for k, v in fields.items() if k not in _IN_PREFIX)
                log.info("%s %s %s", record.method, record.path, text, extra=fields)
