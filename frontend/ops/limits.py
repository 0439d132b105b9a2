"""The request body limit: 413 in the route's API format for a body over `max_body_bytes`, decided
from Content-Length when the client sends one and, whatever it says, while the body is read (chunked
uploads have no Content-Length), so no more than the limit is ever held in memory."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontend import errors
from frontend.errors import APIError


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(
            413, f"request body is larger than the limit of {self.max_bytes} bytes", param="body"
        )
        response = await errors.handle(Request(scope), error)
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        # Read the whole body here (the routes parse JSON, so they would read all of it anyway).
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its request: nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later: the disconnect the streaming code waits for

        await self.app(scope, replay, send)
