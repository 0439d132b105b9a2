"""The FastAPI application: health, model list, and the API routers; Triton is reached over gRPC."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from frontend import errors
from frontend.databricks import routes as databricks
from frontend.embeddings import routes as embeddings
from frontend.engine_client.pipeline import Pipeline
from frontend.engine_client.steps import Triton
from frontend.engine_client.triton import MODELS
from frontend.errors import APIError
from frontend.models import served
from frontend.openai_api import routes as openai_api
from frontend.routing import open_triton
from frontend.tgi import routes as tgi
from tritonlm.embedding import config as embedding_config

# Server setting: stream chunks carry the text so far instead of the new text (seed 001's second
# streaming example, MindIE's fullTextEnabled), and the last chunk a `full_text` field.
STREAM_FULL_TEXT_ENV = "TRITONLM_STREAM_FULL_TEXT"


def create_app(
    triton_url: str,
    model_name: str,
    triton: Triton | None = None,
    embed_model_name: str | None = None,
    stream_full_text: bool | None = None,
    triton_server_id: str | None = None,
) -> FastAPI:
    """`triton`: an object with TritonClient's `stream`/`infer`/`ready` (tests pass a fake);
    by default a gRPC client for `triton_url`, opened on start-up inside the server's event loop.
    `embed_model_name`: the embedding model's id, by default `embedding_config.served_name()`.
    `stream_full_text`: cumulative stream text for the OpenAI routes; None: the
    TRITONLM_STREAM_FULL_TEXT environment variable ("1" or "true" turns it on).
    `triton_server_id`: the `--id` of the tritonserver this frontend belongs to; `/health` fails
    while another server answers at `triton_url`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if triton is not None:
            yield
            return
        client = open_triton(triton_url, server_id=triton_server_id)  # a Router for several
        # The ensemble's steps run from here, so a client that leaves cancels the engine's request.
        app.state.triton = Pipeline(client)
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="tritonlm", lifespan=lifespan)
    app.state.model_name = model_name
    app.state.embed_model_name = embed_model_name or embedding_config.served_name()
    app.state.created = int(time.time())
    if stream_full_text is None:
        stream_full_text = os.environ.get(STREAM_FULL_TEXT_ENV, "").lower() in ("1", "true", "yes")
    app.state.stream_full_text = stream_full_text
    if triton is not None:
        app.state.triton = triton
    errors.install(app)

    @app.get("/health")
    async def health(request: Request) -> dict[str, str]:
        if not await request.app.state.triton.ready(MODELS):
            expected = f" (server id {triton_server_id})" if triton_server_id else ""
            models = ", ".join(MODELS)
            message = f"Triton{expected} not serving at {triton_url}, or models not ready: {models}"
            raise APIError(503, message, "unhealthy")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": request.app.state.created, "owned_by": "tritonlm"}
                for name in served(request)
            ],
        }

    app.include_router(tgi.router)
    app.include_router(openai_api.router)
    app.include_router(databricks.router)  # before embeddings: its invocations route serves all tasks
    app.include_router(embeddings.router)
    return app
