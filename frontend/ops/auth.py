"""API keys: with `API_KEY=k1,k2`, every route but the open ones needs `Authorization: Bearer <key>`
or `x-api-key: <key>` (Anthropic's header, taken on every route so one key header serves every
client); otherwise 401 in the route's API error format. Keys are compared in constant time, all of
them."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from frontend import errors
from frontend.errors import APIError

# Probes, scrapers and the API description stay reachable without a key.
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def key_matches(given: str, keys: tuple[bytes, ...]) -> bool:
    candidate = given.encode()
    matched = False
    for key in keys:  # no early exit: the time taken does not tell which key came close
        matched |= hmac.compare_digest(candidate, key)
    return matched


class ApiKeyMiddleware:
    """`own_key`: which paths check a key of their own (the admin routes), let through."""

    def __init__(
        self, app: ASGIApp, keys: tuple[str, ...], own_key: Callable[[str], bool] | None = None
    ) -> None:
        self.app = app
        self.keys = tuple(k.encode() for k in keys)
        self.own_key = own_key or (lambda _: False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self.own_key(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        api_key = headers.get("x-api-key")
        given = [token.strip()] if scheme.lower() == "bearer" else []
        given += [api_key] if api_key is not None else []
        if any([key_matches(key, self.keys) for key in given]):  # a list: every key is compared
            await self.app(scope, receive, send)
            return
        message = (
            "invalid API key"
            if scheme or api_key is not None
            else "missing API key: send the header `Authorization: Bearer <key>` or `x-api-key: <key>`"
        )
        error = APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        response = await errors.handle(Request(scope), error)
        await response(scope, receive, send)
