"""The FastAPI application: health, model list, and the API routers; Triton is reached over gRPC."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from frontend import errors, tgi
from frontend.errors import APIError
from frontend.generation import Triton
from frontend.triton import MODELS, TritonClient


def create_app(triton_url: str, model_name: str, triton: Triton | None = None) -> FastAPI:
    """`triton`: an object with TritonClient's `stream`/`infer`/`ready` (tests pass a fake);
    by default a gRPC client for `triton_url`, opened on start-up inside the server's event loop."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if triton is not None:
            yield
            return
        client = TritonClient(triton_url)
        app.state.triton = client
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="tritonlm", lifespan=lifespan)
    app.state.model_name = model_name
    app.state.created = int(time.time())
    if triton is not None:
        app.state.triton = triton
    errors.install(app)

    @app.get("/health")
    async def health(request: Request) -> dict[str, str]:
        if not await request.app.state.triton.ready(MODELS):
            raise APIError(503, f"Triton models not ready: {', '.join(MODELS)}", "unhealthy")
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": request.app.state.model_name,
                    "object": "model",
                    "created": request.app.state.created,
                    "owned_by": "tritonlm",
                }
            ],
        }

    app.include_router(tgi.router)
    return app
