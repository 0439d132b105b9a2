"""Every error the HTTP frontend returns, in the shape of the API the request was made to.

- TGI (`POST /` and the rest): `{"error": "...", "error_type": "..."}`, 422 for a bad request.
- OpenAI and Databricks (`/v1/*`, `/serving-endpoints/*`):
  `{"error": {"message": "...", "type": "...", "param": "...", "code": ...}}`, 400 for a bad request
  (the `openai` SDK raises `BadRequestError` for 400, `UnprocessableEntityError` for 422).
- Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`):
  `{"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}` with Anthropic's
  statuses (400 for a bad request, 529 `overloaded_error` while Triton is not serving); fields are
  named by their dotted path (`messages.0.content.1.source`).

Routes raise `APIError` (or let FastAPI raise `RequestValidationError`); `handle` is the only place
that turns an exception into a response, so no route formats errors itself. Streams whose headers are
already sent report errors as an event, in the same shapes (`openai_body`, `APIError.body`), through
`frontend.streaming.with_error_event`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

# TGI's error_type for each status we produce.
ERROR_TYPES = {
    401: "authentication",
    413: "payload_too_large",
    422: "validation",
    429: "overloaded",
    499: "cancelled",
    500: "generation",
    503: "unavailable",
}
# error_type values only TGI's shape uses; OpenAI's `type` is then derived from the status.
_TGI_ONLY_TYPES = {*ERROR_TYPES.values(), "http", "internal", "unhealthy"}
# Seconds a client should wait before retrying a 429 (engine queue full) or 503 (not serving).
RETRY_AFTER_SECONDS = "1"
# Route prefixes answered in OpenAI's error shape.
# vLLM's /tokenize and /detokenize answer as its OpenAI routes do.
OPENAI_PREFIXES = ("/v1/", "/serving-endpoints/", "/tokenize", "/detokenize")
# Routes answered in Anthropic's error shape (checked before OpenAI's prefixes).
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
# Anthropic's error type for each status it documents.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class APIError(Exception):
    """An error for the client. `error_type`: TGI's error_type, or OpenAI's `type` when the route
    is an OpenAI one (None: derived from the status). `param`: the request field at fault. `code`:
    OpenAI's machine-readable code (e.g. "model_not_found"). `headers`: extra response headers
    (e.g. Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str | None = None,
        param: str | None = None,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.explicit_type = error_type
        self.error_type = error_type or ERROR_TYPES.get(status, "error")
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, str]:
        """TGI's shape."""
        return {"error": self.message, "error_type": self.error_type}


def internal_error() -> APIError:
    """What a client learns of an unexpected failure: its trace goes to the server's log only."""
    return APIError(500, "internal server error", "internal")


def invalid_request(status: int, message: str, param: str) -> APIError:
    """A refusal of the request's field `param`, as OpenAI's `invalid_request_error`."""
    return APIError(status, message, "invalid_request_error", param=param)


class ClientDisconnected(Exception):
    """The HTTP client went away before a response could be sent; nothing is left to answer."""


def openai_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    return "invalid_request_error" if status < 500 else "server_error"


def openai_status(status: int) -> int:
    # Triton and our models call a client mistake 422 (TGI's status); OpenAI's APIs say 400.
    return 400 if status == 422 else status


def openai_body(exc: APIError) -> dict[str, dict]:
    """OpenAI's error object (also what an SSE error event carries)."""
    kind = exc.explicit_type if exc.explicit_type not in _TGI_ONLY_TYPES else None
    return {
        "error": {
            "message": exc.message,
            "type": kind or openai_type(openai_status(exc.status)),
            "param": exc.param,
            "code": exc.code,
        }
    }


def anthropic_status(status: int) -> int:
    # A client mistake is 400 in Anthropic's API; "not serving now, retry" is its 529 (overloaded).
    return {422: 400, 503: 529}.get(status, status if status in ANTHROPIC_TYPES or status < 500 else 500)


def anthropic_body(exc: APIError) -> dict[str, object]:
    """Anthropic's error object (also what a stream's `error` event carries)."""
    status = anthropic_status(exc.status)
    kind = ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def is_anthropic_route(request: Request) -> bool:
    return request.url.path in ANTHROPIC_PATHS


def is_openai_route(request: Request) -> bool:
    return request.url.path.startswith(OPENAI_PREFIXES)


def error_response(status: int, message: str, error_type: str | None = None) -> JSONResponse:
    """A TGI-shaped error response (for code outside a request's routing, e.g. middleware)."""
    return JSONResponse(APIError(status, message, error_type).body(), status_code=status)


def _path(loc: tuple, dotted: bool = False) -> str:
    # FastAPI prefixes body errors with "body"; the client knows the fields by their JSON path
    # (`a[0].b`, or Anthropic's `a.0.b` when `dotted`).
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    if dotted:
        return ".".join(str(part) for part in parts)
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _describe(error: dict, dotted: bool = False) -> str:
    kind, msg = error.get("type", ""), str(error.get("msg", ""))
    if kind == "json_invalid":
        return f"request body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    path = _path(tuple(error.get("loc", ())), dotted)
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


def _as_api_error(exc: Exception, dotted: bool = False) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestValidationError):
        errors = list(exc.errors())
        param = next((p for p in (_path(tuple(e.get("loc", ())), dotted) for e in errors) if p), None)
        return APIError(422, "; ".join(_describe(e, dotted) for e in errors), param=param)
    if isinstance(exc, HTTPException):
        if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8, …): a bad request
            return APIError(422, f"request body could not be parsed: {exc.detail}", headers=exc.headers)
        return APIError(exc.status_code, str(exc.detail), "http", headers=exc.headers)
    # Starlette re-raises after this, so the server logs the trace; the client never sees it.
    return internal_error()


async def handle(request: Request, exc: Exception) -> Response:
    """The one exception handler: any exception -> the error response of the request's API."""
    if isinstance(exc, ClientDisconnected):
        return Response(status_code=499)  # nobody reads it; the status shows up in access logs
    anthropic = is_anthropic_route(request)
    error = _as_api_error(exc, dotted=anthropic)
    from frontend.ops.tracing import note_error  # here: frontend.ops imports this module

    note_error(error)  # the request's span, when tracing is on, says what the client was told
    headers = dict(error.headers or {})
    if error.status in (429, 503):
        headers.setdefault("Retry-After", RETRY_AFTER_SECONDS)
    if anthropic:
        status = anthropic_status(error.status)
        return JSONResponse(anthropic_body(error), status_code=status, headers=headers)
    if is_openai_route(request):
        status = openai_status(error.status)
        return JSONResponse(openai_body(error), status_code=status, headers=headers)
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def install(app: FastAPI) -> None:
    for kind in (APIError, RequestValidationError, HTTPException, ClientDisconnected, Exception):
        app.add_exception_handler(kind, handle)
