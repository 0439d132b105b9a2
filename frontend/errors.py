"""Every error the HTTP frontend returns, in TGI's shape: `{"error": "...", "error_type": "..."}`.

Routes raise `APIError` (or let FastAPI raise `RequestValidationError`); the handlers registered
here are the only place that turns an exception into a response, so no route formats errors itself.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

# TGI's error_type for each status we produce.
ERROR_TYPES = {
    422: "validation",
    499: "cancelled",
    500: "generation",
    503: "unavailable",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type or ERROR_TYPES.get(status, "error")

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


class ClientDisconnected(Exception):
    """The HTTP client went away before a response could be sent; nothing is left to answer."""


def error_response(status: int, message: str, error_type: str | None = None) -> JSONResponse:
    return JSONResponse(APIError(status, message, error_type).body(), status_code=status)


def _path(loc: tuple) -> str:
    # FastAPI prefixes body errors with "body"; the client knows the fields by their JSON path.
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _describe(error: dict) -> str:
    kind, msg = error.get("type", ""), str(error.get("msg", ""))
    if kind == "json_invalid":
        return f"request body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    path = _path(tuple(error.get("loc", ())))
    if kind == "extra_forbidden":
        text = "unknown field; it is not a parameter of this API"
    elif kind == "missing":
        text = "required field is missing"
    elif kind in ("model_attributes_type", "model_type", "dict_type"):
        text = "must be a JSON object"
    else:
        text = msg.removeprefix("Value error, ")
    if path:
        return f"{path}: {text}"
    # Body-level: model validators name their fields in the message; the rest is about the body.
    return text if kind == "value_error" else f"request body {text}"


async def _api_error(_: Request, exc: APIError) -> Response:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
    return error_response(422, "; ".join(_describe(e) for e in exc.errors()))


async def _http_error(_: Request, exc: HTTPException) -> Response:
    return error_response(exc.status_code, str(exc.detail), "http")


async def _disconnected(_: Request, __: ClientDisconnected) -> Response:
    return Response(status_code=499)  # nobody reads it; the status shows up in access logs


async def _unexpected(_: Request, __: Exception) -> Response:
    # Starlette re-raises after this, so the server logs the trace; the client never sees it.
    return error_response(500, "internal server error", "internal")


def install(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClientDisconnected, _disconnected)
    app.add_exception_handler(Exception, _unexpected)
