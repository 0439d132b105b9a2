"""Databricks model serving: `POST /serving-endpoints/{name}/invocations`, where the
endpoint name selects the model and the body's fields the task (`messages`: chat, `prompt`:
completions, `input`: embeddings, served by frontend.embeddings.routes); and
`POST /serving-endpoints/chat/completions` | `/serving-endpoints/completions` with `model` naming the
endpoint, which is what the `openai` SDK calls with `base_url=".../serving-endpoints"`. They run
the OpenAI routes' `serve` with Databricks' schemas (databricks.schema) and shapes (databricks.format).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from starlette.responses import Response

from frontend.databricks.format import DatabricksChatFormat, DatabricksCompletionFormat
from frontend.databricks.schema import (
    DatabricksChatRequest,
    DatabricksCompletionRequest,
    NamedDatabricksChatRequest,
    NamedDatabricksCompletionRequest,
)
from frontend.errors import APIError
from frontend.models import resolve_model, traits
from frontend.openai_api.routes import serve
from frontend.openai_api.schema import parse_body

router = APIRouter()


@router.post("/serving-endpoints/chat/completions")
async def chat(req: NamedDatabricksChatRequest, request: Request) -> Response:
    return await _chat(request, req.model, req)


@router.post("/serving-endpoints/completions")
async def completions(req: NamedDatabricksCompletionRequest, request: Request) -> Response:
    return await _completions(request, req.model, req)


@router.post("/serving-endpoints/{name}/invocations")
async def invocations(name: str, request: Request, body: Annotated[Any, Body()]) -> Any:
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object", "invalid_request_error")
    if "input" in body:
        return await _embeddings(request, name, body)
    if "messages" in body:
        return await _chat(request, name, parse_body(DatabricksChatRequest, body))
    if "prompt" in body:
        return await _completions(request, name, parse_body(DatabricksCompletionRequest, body))
    raise APIError(
        400,
        "the body must have `messages` (chat task), `prompt` (completions task) or `input` (embeddings task)",
        "invalid_request_error",
    )


async def _chat(request: Request, name: str, req: DatabricksChatRequest) -> Response:
    model = resolve_model(request, name, "generate")
    parsers = traits(request, model)
    fmt = DatabricksChatFormat(
        model, tool_parser=parsers.tool_parser, reasoning_parser=parsers.reasoning_parser
    )
    return await serve(request, fmt, [req.to_job()])


async def _completions(request: Request, name: str, req: DatabricksCompletionRequest) -> Response:
    model = resolve_model(request, name, "generate")
    return await serve(request, DatabricksCompletionFormat(model), req.to_jobs())


async def _embeddings(request: Request, name: str, body: dict[str, Any]) -> Any:
    # Imported when used: the embeddings task lives in its own module, which a deployment may lack.
    try:
        handler = importlib.import_module("frontend.embeddings.routes").embeddings_invocation
    except (ImportError, AttributeError):
        raise APIError(
            400, "this server has no embedding model", "invalid_request_error", param="input"
        ) from None
    result = handler(request, name, body)
    return await result if inspect.isawaitable(result) else result
