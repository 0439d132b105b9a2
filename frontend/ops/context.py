"""What the frontend knows about the request being served, wherever in its code it is asked.

The request-id middleware opens a `RequestRecord` in a context variable; every task the request
spawns (streams, n/best_of fan-out) inherits it. The generation path reports each `Step` to it (token
counts, first-token time, inter-token gaps), which the access log and the metrics read at the end.
"""

from __future__ import annotations

import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

_current: ContextVar[RequestRecord | None] = ContextVar("tritonlm_request", default=None)


@dataclass
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.monotonic)
    route: str | None = None  # the route's path template, once routed
    status: int | None = None
    streamed: bool = False
    tokens_in: int = 0
    tokens_out: int = 0
    first_token_at: float | None = None
    token_gaps: list[float] = field(default_factory=list)  # seconds between token-carrying steps

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.started


def open_record(record: RequestRecord) -> Any:
    """Make `record` the current request's; returns the token for `close_record`."""
    return _current.set(record)


def close_record(token: Any) -> None:
    _current.reset(token)


def current() -> RequestRecord | None:
    return _current.get()


def request_id() -> str:
    """The current request's id ("" outside a request), passed on to Triton."""
    record = _current.get()
    return record.request_id if record is not None else ""


class SequenceTracker:
    """One generated sequence's timing within the current request (a no-op outside one)."""

    def __init__(self, counts_prompt: bool = True) -> None:
        self.record = _current.get()
        self.counts_prompt = counts_prompt  # n sequences of one prompt count its tokens once
        self.last: float | None = None

    def step(self, prompt_tokens: int | None, new_tokens: int) -> None:
        record = self.record
        if record is None:
            return
        if self.counts_prompt and prompt_tokens is not None:
            record.tokens_in += prompt_tokens
            self.counts_prompt = False
        if not new_tokens:
            return
        now = time.monotonic()
        record.tokens_out += new_tokens
        if record.first_token_at is None:
            record.first_token_at = now
        if self.last is not None:
            record.token_gaps.append(now - self.last)
        self.last = now


def count_tokens(tokens_in: int = 0, tokens_out: int = 0) -> None:
    """Token counts of work that has no steps (embeddings)."""
    record = _current.get()
    if record is not None:
        record.tokens_in += tokens_in
        record.tokens_out += tokens_out


def route_of(scope: dict[str, Any]) -> str:
    """The route's path template (label values stay few), or "unmatched" (404s). A request refused
    before routing (401, 413) is matched against the documented paths."""
    path = getattr(scope.get("route"), "path", None)
    app = scope.get("app")
    if path is None and app is not None:
        templates = getattr(app.state, "route_templates", None)
        if templates is None:
            templates = app.state.route_templates = [
                (re.compile(re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(t)) + "$"), t)
                for t in app.openapi()["paths"]
            ]
        path = next((t for pattern, t in templates if pattern.match(scope["path"])), None)
    return path or "unmatched"
