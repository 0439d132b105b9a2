"""The FastAPI application: health, model list, and the API routers; Triton is reached over gRPC."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from opentelemetry.trace import TracerProvider

from frontend import errors
from frontend.admin.routes import install as install_admin
from frontend.anthropic import routes as anthropic
from frontend.config import FrontendConfig
from frontend.databricks import routes as databricks
from frontend.embeddings import routes as embeddings
from frontend.engine_client.served import ServedModel
from frontend.engine_client.steps import Triton
from frontend.engine_client.traced import TracedTriton
from frontend.engine_client.triton import EMBEDDING
from frontend.errors import APIError
from frontend.media import MediaSources
from frontend.model_traits import read_traits
from frontend.models import served, traits
from frontend.openai_api import routes as openai_api
from frontend.ops import install as install_ops
from frontend.ops import tracing
from frontend.responses import routes as responses
from frontend.responses.store import ResponseStore
from frontend.routing import open_triton
from frontend.tgi import routes as tgi
from frontend.tokenize import render
from frontend.tokenize import routes as tokenize
from tritonlm.config import EngineConfig
from tritonlm.lora.format import parse_lora_modules
from tritonlm.serving.model_set import kind_of


def create_app(
    config: FrontendConfig,
    triton: Triton | None = None,
    lora_adapters: list[str] | None = None,
    media_kinds: Sequence[str] | None = None,
    media: MediaSources | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """The app for `config` (frontend.config: Triton's address, the models' names, API keys, parsers,
    media settings, …).
    `triton`: an object with TritonClient's `stream`/`infer`/`ready` (tests pass a fake);
    by default a gRPC client for `config.triton_url()`, opened on start-up inside the server's event
    loop.
    `lora_adapters`: the LoRA adapters' names; None: the engine's `lora_modules` setting, read on
    start-up (`engine_lora_adapters`).
    `media_kinds`: the media every model started with takes (image, video, audio); None: what each
    checkpoint's config.json says (none without one: a text-only model).
    `media`: where media bytes may come from and the limits; None: from `config`.
    `tracer_provider`: where the spans go (tests pass the SDK's with an in-memory exporter); None:
    the one the OTEL_* variables ask for (frontend.ops.tracing), shut down (flushed) with the app, or
    none: tracing off."""
    triton_url, server_id = config.triton_url(), config.triton_server_id or None
    own_provider = tracing.provider_from_env() if tracer_provider is None else None
    provider = tracer_provider or own_provider
    tracer = provider.get_tracer(tracing.TRACER_NAME) if provider is not None else None

    def traced(client: Triton) -> Triton:
        """`client`, its calls spans when tracing is on."""
        return client if tracer is None else TracedTriton(client, tracer, lambda name: served_name(app, name))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            if triton is not None:
                yield
                return
            # A Router for several replicas; its per-replica metrics join the frontend's /metrics.
            client = open_triton(triton_url, server_id=server_id, registry=app.state.metrics.registry)
            if lora_adapters is None:
                app.state.lora_adapters = await engine_lora_adapters(client)
            app.state.triton = traced(client)  # the routes' EngineClient runs preprocessing, then the engine
            try:
                yield
            finally:
                await client.close()
        finally:
            if own_provider is not None:
                await asyncio.to_thread(own_provider.shutdown)  # exports the spans still queued

    app = FastAPI(title="tritonlm", lifespan=lifespan)
    # Each model's parsers and media from its own checkpoint: it answers as it would served alone.
    served_models = [
        ServedModel(m, read_traits(config, m.model_dir, media_kinds)) for m in config.served_models()
    ]
    app.state.served_models = {model.name: model for model in served_models}
    app.state.model_name = served_models[0].name  # the default model
    app.state.model_dir = config.model_dir  # the checkpoint (engine_info: its config.json)
    app.state.embed_model_name = config.embed_name()
    app.state.lora_adapters = tuple(lora_adapters or ())
    app.state.created = int(time.time())
    app.state.stream_full_text = config.stream_full_text
    app.state.responses_store = ResponseStore(config.responses_store_size)  # Responses' store, in memory
    app.state.media = media if media is not None else MediaSources.from_config(config)
    if triton is not None:
        app.state.triton = traced(triton)
    errors.install(app)
    install_ops(app, config, tracer)

    app.state.triton_url, app.state.server_id = triton_url, server_id  # /health says where
    app.include_router(_own)  # /health, /v1/models
    install_admin(app, config)  # ADMIN_API_KEY: loading LoRA adapters and models at run time
    app.include_router(tgi.router)
    app.include_router(openai_api.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(databricks.router)  # before embeddings: its invocations route serves all tasks
    app.include_router(embeddings.router)
    app.include_router(tokenize.router)
    app.include_router(render.router)
    return app


# The app's own routes (the APIs' are in their folders).
_own = APIRouter()


@_own.get("/health")
async def health(request: Request) -> dict[str, str]:
    state = request.app.state
    names = triton_models(state.served_models.values())
    if not await state.triton.ready(names):
        expected = f" (server id {state.server_id})" if state.server_id else ""
        models = ", ".join(names)
        message = f"Triton{expected} not serving at {state.triton_url}, or models not ready: {models}"
        raise APIError(503, message, "unhealthy")
    return {"status": "ok"}


@_own.get("/v1/models")
async def models(request: Request) -> dict:
    state = request.app.state
    cards = []
    for name, task in served(request).items():
        card = {"id": name, "object": "model", "created": state.created, "owned_by": "tritonlm"}
        if task == "generate":  # what a request that leaves them out samples with
            card["sampling_defaults"] = traits(request, name).sampling.as_dict()
        if name in state.lora_adapters:  # vLLM's way: an adapter's parent is its base model
            card["parent"] = state.model_name
        if name in state.runtime_adapters:  # and its root the directory it came from
            card.update(root=state.runtime_adapters[name].path, parent=state.model_name)
        cards.append(card)
    return {"object": "list", "data": cards}


def served_name(app: FastAPI, triton_name: str) -> str:
    """The name clients give the model a Triton model belongs to (its spans' gen_ai.request.model)."""
    kind = kind_of(triton_name)
    if kind == EMBEDDING:
        return app.state.embed_model_name
    for model in app.state.served_models.values():
        if model.models.triton_name(kind) == triton_name:
            return model.name
    return triton_name


def triton_models(served_models: Iterable[ServedModel]) -> tuple[str, ...]:
    """The Triton models /health waits for: every served model's that is not loading, the
    embedding model; a text-only server's encoders included, as they always load."""
    names = [name for model in served_models if not model.loading for name in model.models.triton_names()]
    return (*names, EMBEDDING)


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
