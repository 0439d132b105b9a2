"""Embeddings: OpenAI's `POST /v1/embeddings` and Databricks' embeddings task.

Both check the request here and call the Triton `embedding` model, which batches concurrent
requests into one forward pass. Input lists longer than its max_batch_size are sent as several
Triton requests at once. Errors are raised as APIError and rendered by frontend.errors.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from frontend.engine_client.triton import EMBEDDING
from frontend.errors import APIError
from frontend.models import resolve_model
from frontend.openai_api.schema import parse_body
from frontend.ops.context import count_tokens
from tritonlm.contract import EMBEDDING_MAX_BATCH_SIZE

router = APIRouter()

MAX_INPUTS = 2048  # OpenAI's limit on texts per request

# OpenAI also takes token ids; the frontend has no tokenizer, so they are refused by name.
Input = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request, plus Databricks' `instruction`."""

    model_config = ConfigDict(extra="forbid")
    input: Input
    model: str | None = None  # None: the embedding model
    encoding_format: str | None = None  # "float" (default) or "base64"; checked by hand for a 400
    dimensions: int | None = None
    user: str | None = None  # accepted, unused
    instruction: str | None = None


class InvocationRequest(BaseModel):
    """Databricks' embeddings request."""

    model_config = ConfigDict(extra="forbid")
    input: Input
    instruction: str | None = None


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, "invalid_request_error", param=param)


def texts_of(value: Input) -> list[str]:
    """The input as a list of non-empty texts, or a 400 naming `input`."""
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise _bad("input must not be empty", "input")
    if len(texts) > MAX_INPUTS:
        raise _bad(f"input has {len(texts)} items; at most {MAX_INPUTS} are allowed", "input")
    for i, text in enumerate(texts):
        where = "input" if isinstance(value, str) else f"input[{i}]"
        if not isinstance(text, str):
            raise _bad("input as token ids is not supported: send text", "input")
        if not text:
            raise _bad(f"{where} must not be an empty string", "input")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(f"{where} is not valid Unicode (a lone surrogate?)", "input") from None
    return texts


async def embed(request: Request, texts: list[str], instruction: str | None) -> tuple[np.ndarray, int]:
    """([len(texts), dimension] vectors, prompt tokens) from the Triton embedding model."""
    triton = request.app.state.triton
    chunks = [texts[i : i + EMBEDDING_MAX_BATCH_SIZE] for i in range(0, len(texts), EMBEDDING_MAX_BATCH_SIZE)]

    def inputs(chunk: list[str]) -> dict[str, np.ndarray]:
        arrays = {"text": np.array([t.encode() for t in chunk], dtype=np.object_).reshape(-1, 1)}
        if instruction:
            arrays["instruction"] = np.full((len(chunk), 1), instruction.encode(), dtype=np.object_)
        return arrays

    results = await asyncio.gather(*(triton.infer(EMBEDDING, inputs(c)) for c in chunks))
    vectors = np.concatenate([r["embedding"] for r in results]).astype(np.float32)
    tokens = int(sum(int(r["token_count"].sum()) for r in results))
    count_tokens(tokens_in=tokens)
    return vectors, tokens


def _encode(vector: np.ndarray, base64_format: bool) -> list[float] | str:
    # base64: the float32 values' little-endian bytes, which the openai SDK decodes.
    return base64.b64encode(vector.astype("<f4").tobytes()).decode() if base64_format else vector.tolist()


def _items(vectors: np.ndarray, base64_format: bool = False) -> list[dict[str, Any]]:
    return [
        {"object": "embedding", "index": i, "embedding": _encode(v, base64_format)}
        for i, v in enumerate(vectors)
    ]


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


@router.post("/v1/embeddings")
async def embeddings(request: Request, body: EmbeddingRequest) -> dict[str, Any]:
    model = resolve_model(request, body.model, "embed")
    if body.encoding_format not in (None, "float", "base64"):
        wrong = body.encoding_format
        raise _bad(f"encoding_format must be 'float' or 'base64', not {wrong!r}", "encoding_format")
    if body.dimensions is not None and body.dimensions < 1:
        raise _bad("dimensions must be a positive integer", "dimensions")
    vectors, tokens = await embed(request, texts_of(body.input), body.instruction)
    # The dimension is the model's (a Matryoshka model could be cut, MiniLM cannot): known once we have
    # a vector, so a wrong `dimensions` is refused after the forward pass.
    if body.dimensions is not None and body.dimensions != vectors.shape[1]:
        raise _bad(
            f"dimensions must be {vectors.shape[1]} for model '{model}', which cannot shorten its "
            f"vectors; got {body.dimensions}",
            "dimensions",
        )
    return {
        "object": "list",
        "data": _items(vectors, body.encoding_format == "base64"),
        "model": model,
        "usage": _usage(tokens),
    }


async def embeddings_invocation(request: Request, name: str, body: dict) -> dict[str, Any]:
    """Databricks' embeddings task for `POST /serving-endpoints/{name}/invocations` (a body with
    `input`); the Databricks route dispatches here."""
    model = resolve_model(request, name, "embed")
    req = parse_body(InvocationRequest, body)
    vectors, tokens = await embed(request, texts_of(req.input), req.instruction)
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "model": model,
        "data": _items(vectors),
        "usage": _usage(tokens),
    }
