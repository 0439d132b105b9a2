"""`POST /v1/models/{name}/load` (body `{"model_dir": PATH}`) and `POST /v1/models/{name}/unload`:
generative models loaded and unloaded at run time with Triton's explicit model control.

Loading writes the model's Triton models into the server's repository (MODEL_REPOSITORY, which the
launcher sets; tritonlm/serving/repository.py) from a checkpoint under MODEL_ALLOWED_DIRS (a
directory with config.json, or a GGUF file or a directory holding one, whose checkpoint directory is
written first, as MODEL_DIRS' are: tritonlm/gguf_checkpoint.py), and has
every replica load them; meanwhile requests for the name get 503 with Retry-After. The answer comes
when the model serves. Unloading takes the name away at once (new requests get 404 naming the
models), waits until the requests running on it have finished, then unloads its Triton models. The
default model (the first of MODEL_DIRS) stays.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from frontend.engine_client.served import ModelTraits, ServedModel
from frontend.errors import APIError, invalid_request
from frontend.field_rules import resolved_under
from frontend.models import served
from tritonlm import gguf_checkpoint
from tritonlm.config import ConfigError
from tritonlm.serving import repository
from tritonlm.serving.model_set import ModelSet, check_unique, prefix_for

log = logging.getLogger(__name__)
router = APIRouter()
_NAME_LIMIT = 128


class LoadModelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_dir: str


def _check_new_name(request: Request, name: str) -> None:
    state = request.app.state
    if not name.strip() or len(name) > _NAME_LIMIT or name != name.strip():
        message = f"model: a name of 1 to {_NAME_LIMIT} characters, no leading or trailing spaces"
        raise invalid_request(400, message, "model")
    if name in state.served_models:
        what = "is loading" if state.served_models[name].loading else "is already served"
        raise invalid_request(400, f"the model '{name}' {what}: unload it first", "model")
    if name in served(request):
        raise invalid_request(
            400, f"'{name}' is the name of a served model or adapter: choose another", "model"
        )


def _checkpoint(request: Request, model_dir: str) -> Path:
    """`model_dir` resolved, when it is a checkpoint directory or a GGUF file under
    MODEL_ALLOWED_DIRS."""
    roots = request.app.state.model_allowed_dirs
    try:
        resolved = resolved_under(model_dir, roots)
        if resolved is None:
            allowed = ", ".join(str(root) for root in roots) or "none"
            message = f"model_dir: the path is outside MODEL_ALLOWED_DIRS ({allowed})"
            raise invalid_request(400, message, "model_dir")
        if not (resolved / "config.json").is_file() and gguf_checkpoint.source(resolved) is None:
            message = (
                f"model_dir: no checkpoint at {model_dir!r} (a directory with config.json, or a GGUF file)"
            )
            raise invalid_request(404, message, "model_dir")
    except ConfigError as error:  # a directory of several GGUF files
        raise invalid_request(400, str(error), "model_dir") from None
    except (OSError, ValueError, RuntimeError):  # NUL bytes, symlink loops, permissions
        raise invalid_request(400, "model_dir: the path cannot be read", "model_dir") from None
    return resolved


async def _prepared(path: Path) -> Path:
    """The directory to serve `path` from: itself, or a GGUF file's written checkpoint directory
    (seconds, once per file)."""
    try:
        return await asyncio.to_thread(gguf_checkpoint.prepare, path)
    except ConfigError as error:  # not a model transformers reads, or not a causal LM
        raise invalid_request(400, str(error), "model_dir") from None


def _model_set(request: Request, name: str, model_dir: Path) -> ModelSet:
    state = request.app.state
    model = ModelSet(name, str(model_dir), prefix_for(name, first=False))
    try:
        check_unique([*(m.models for m in state.served_models.values()), model], "model")
    except ConfigError as error:
        raise invalid_request(400, str(error), "model") from None
    return model


async def _load(request: Request, model: ModelSet) -> None:
    """Writes `model` into the repository and loads it on Triton; undoes what it did on failure."""
    state = request.app.state
    root = Path(state.model_repository)
    share = 1.0 / len(state.served_models)  # counting this one: its share of what is free now
    names = await asyncio.to_thread(repository.write_model, root, model, share)
    loaded: list[str] = []
    try:
        for triton_name in names:
            await state.triton.load(triton_name)
            loaded.append(triton_name)
    except APIError as error:
        for triton_name in reversed(loaded):
            await state.triton.unload(triton_name)
        await asyncio.to_thread(repository.remove_model, root, model)
        raise invalid_request(
            400, f"model_dir: the model does not load: {error.message}", "model_dir"
        ) from None


async def _traits(request: Request, model_dir: str) -> ModelTraits:
    """The loaded model's own parsers and media, from its checkpoint (as at start-up)."""
    try:
        return await asyncio.to_thread(request.app.state.read_traits, model_dir)
    except (OSError, ValueError, AttributeError) as error:  # unreadable or malformed JSON
        message = f"model_dir: its config.json or chat template cannot be read: {error}"
        raise invalid_request(400, message, "model_dir") from None


def _card(request: Request, model: ServedModel) -> dict:
    created = request.app.state.created
    return {"id": model.name, "object": "model", "created": created, "owned_by": "tritonlm",
            "root": model.models.model_dir}  # fmt: skip


@router.post("/v1/models/{model}/load")
async def load_model(model: str, body: LoadModelRequest, request: Request) -> dict:
    """Serve the checkpoint at `model_dir` (under MODEL_ALLOWED_DIRS) as the model named `model`."""
    state = request.app.state
    if not state.model_repository:
        raise invalid_request(400, "loading models is off: the server sets no MODEL_REPOSITORY", "model_dir")
    _check_new_name(request, model)
    models = _model_set(request, model, await _prepared(_checkpoint(request, body.model_dir)))
    served_model = ServedModel(models, await _traits(request, models.model_dir), loading=True)
    state.served_models[model] = served_model  # requests for it: 503 until it serves
    await asyncio.shield(_serve(request, served_model))  # a client gone does not stop it halfway
    return _card(request, served_model)


async def _serve(request: Request, model: ServedModel) -> None:
    """Loads `model` and serves it, or forgets it when it does not load."""
    started = time.monotonic()
    try:
        await _load(request, model.models)
    except BaseException:
        request.app.state.served_models.pop(model.name, None)
        raise
    model.loading = False
    elapsed = time.monotonic() - started
    log.info("model %r loaded from %s in %.1f s", model.name, model.models.model_dir, elapsed)


@router.post("/v1/models/{model}/unload")
async def unload_model(model: str, request: Request) -> dict:
    """Stop serving the model named `model`; answers once the requests running on it have finished."""
    state = request.app.state
    served_model = state.served_models.get(model)
    if served_model is None:
        known = ", ".join(f"'{n}'" for n in state.served_models)
        message = f"the model '{model}' is not served; the generative models are {known}"
        raise invalid_request(404, message, "model")
    if model == state.model_name:
        raise invalid_request(
            400, f"'{model}' is the default model (the first of MODEL_DIRS): it stays", "model"
        )
    if served_model.loading:
        raise invalid_request(400, f"the model '{model}' is loading: unload it once it serves", "model")
    del state.served_models[model]  # new requests: 404
    await served_model.in_use.idle()
    for triton_name in reversed(served_model.models.triton_names()):  # the ensemble first
        await state.triton.unload(triton_name)
    if state.model_repository:
        await asyncio.to_thread(repository.remove_model, Path(state.model_repository), served_model.models)
    log.info("model %r unloaded", model)
    return {"id": model, "object": "model", "deleted": True}
