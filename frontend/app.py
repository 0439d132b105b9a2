"""The FastAPI application: health, model list, and the API routers; Triton is reached over gRPC."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request

from frontend import errors
from frontend.chat_tools.reply import check_parsers
from frontend.databricks import routes as databricks
from frontend.embeddings import routes as embeddings
from frontend.engine_client.steps import Triton
from frontend.engine_client.triton import MODELS
from frontend.errors import APIError
from frontend.media import MediaSources
from frontend.models import served
from frontend.openai_api import routes as openai_api
from frontend.ops import install as install_ops
from frontend.ops.settings import OpsSettings
from frontend.routing import open_triton
from frontend.tgi import routes as tgi
from tritonlm.config import EngineConfig
from tritonlm.embedding import config as embedding_config
from tritonlm.lora.format import parse_lora_modules
from tritonlm.multimodal.architectures import media_kinds as checkpoint_media_kinds

# Server setting: stream chunks carry the text so far instead of the new text (seed 001's second
# streaming example, MindIE's fullTextEnabled), and the last chunk a `full_text` field.
STREAM_FULL_TEXT_ENV = "TRITONLM_STREAM_FULL_TEXT"
# How chat replies are read (frontend.chat_tools): these variables override the parsers the
# launcher picked from the chat template.
TOOL_PARSER_ENV, REASONING_PARSER_ENV = "TRITONLM_TOOL_PARSER", "TRITONLM_REASONING_PARSER"


def create_app(
    triton_url: str,
    model_name: str,
    triton: Triton | None = None,
    embed_model_name: str | None = None,
    stream_full_text: bool | None = None,
    ops: OpsSettings | None = None,
    lora_adapters: list[str] | None = None,
    triton_server_id: str | None = None,
    tool_parser: str | None = None,
    reasoning_parser: str | None = None,
    tools_in_prompt: bool = False,
    model_dir: str | Path | None = None,
    media_kinds: Sequence[str] | None = None,
    media: MediaSources | None = None,
) -> FastAPI:
    """`triton`: an object with TritonClient's `stream`/`infer`/`ready` (tests pass a fake);
    by default a gRPC client for `triton_url`, opened on start-up inside the server's event loop.
    `embed_model_name`: the embedding model's id, by default `embedding_config.served_name()`.
    `stream_full_text`: cumulative stream text for the OpenAI routes; None: the
    TRITONLM_STREAM_FULL_TEXT environment variable ("1" or "true" turns it on).
    `ops`: API keys, body limit, … (frontend/ops); None: from the environment.
    `lora_adapters`: the LoRA adapters' names; None: the engine's `lora_modules` setting, read on
    start-up (`engine_lora_adapters`).
    `triton_server_id`: the `--id` of the tritonserver this frontend belongs to; `/health` fails
    while another server answers at `triton_url`.
    `model_dir`: the served checkpoint, whose config.json says which media it takes (image, video,
    audio); `media_kinds` overrides it; neither: a text-only model.
    `media`: where media bytes may come from and the limits; None: from the environment
    (ALLOWED_LOCAL_MEDIA_PATH, ALLOWED_MEDIA_DOMAINS, MEDIA_*)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if triton is not None:
            yield
            return
        # A Router for several replicas; its per-replica metrics join the frontend's /metrics.
        client = open_triton(triton_url, server_id=triton_server_id, registry=app.state.metrics.registry)
        if lora_adapters is None:
            app.state.lora_adapters = await engine_lora_adapters(client)
        app.state.triton = client  # the routes' EngineClient runs preprocessing, then the engine
        try:
            yield
        finally:
            await client.close()

    app = FastAPI(title="tritonlm", lifespan=lifespan)
    app.state.model_name = model_name
    app.state.embed_model_name = embed_model_name or embedding_config.served_name()
    app.state.lora_adapters = tuple(lora_adapters or ())
    app.state.created = int(time.time())
    if stream_full_text is None:
        stream_full_text = os.environ.get(STREAM_FULL_TEXT_ENV, "").lower() in ("1", "true", "yes")
    app.state.stream_full_text = stream_full_text
    app.state.tool_parser = os.environ.get(TOOL_PARSER_ENV) or tool_parser or "hermes"
    app.state.reasoning_parser = os.environ.get(REASONING_PARSER_ENV) or reasoning_parser or "think"
    check_parsers(app.state.tool_parser, app.state.reasoning_parser)
    app.state.tools_in_prompt = tools_in_prompt  # the chat template knows no tools
    if media_kinds is None:
        media_kinds = checkpoint_media_kinds(model_dir) if model_dir is not None else ()
    app.state.media_kinds = tuple(media_kinds)
    app.state.media = media if media is not None else MediaSources.from_env()
    if triton is not None:
        app.state.triton = triton
    errors.install(app)
    install_ops(app, ops if ops is not None else OpsSettings.from_env())

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
        state = request.app.state
        cards = []
        for name in served(request):
            card = {"id": name, "object": "model", "created": state.created, "owned_by": "tritonlm"}
            if name in state.lora_adapters:  # vLLM's way: an adapter's parent is its base model
                card["parent"] = state.model_name
            cards.append(card)
        return {"object": "list", "data": cards}

    app.include_router(tgi.router)
    app.include_router(openai_api.router)
    app.include_router(databricks.router)  # before embeddings: its invocations route serves all tasks
    app.include_router(embeddings.router)
    return app


async def engine_lora_adapters(client: Triton) -> tuple[str, ...]:
    """The names of the engine's LoRA adapters: its `lora_modules` setting as the engine reads it,
    from its config.pbtxt parameter (asked of Triton) and this process's environment, which the
    launcher shares with tritonserver (LORA_MODULES, TRITONLM_LORA_MODULES). A server without the
    engine yet serves none."""
    try:
        parameters = await client.model_parameters("engine")
    except APIError:
        parameters = {}
    return tuple(parse_lora_modules(EngineConfig.from_parameters(parameters).lora_modules))
