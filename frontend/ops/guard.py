"""The innermost ops middleware: an exception no route handled still gets its error response here,
inside the other middlewares, so it carries the request id and is counted and logged like any other.
(Starlette would render it outside every middleware, in ServerErrorMiddleware.)"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from frontend import errors


class ErrorGuardMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if not started:
                response = await errors.handle(Request(scope), exc)
                await response(scope, receive, send)
            raise  # the server logs the trace; with the response sent, Starlette sends nothing more
