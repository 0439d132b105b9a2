"""`X-Request-Id`: the client's (when it is a sane token) or a new one; on every response, in every
log line of the request, and sent to Triton as the inference request's id."""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontend.ops.context import RequestRecord, close_record, open_record

HEADER = "X-Request-Id"
# What we accept from a client: printable, no spaces, short enough for a log line and a Triton id.
_ACCEPTED = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def new_request_id() -> str:
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Outermost: opens the request's `RequestRecord` and stamps the id on the response headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get(HEADER)
        request_id = given if given and _ACCEPTED.fullmatch(given) else new_request_id()
        record = RequestRecord(request_id, scope["method"], scope["path"])

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        token = open_record(record)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            close_record(token)
