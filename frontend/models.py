"""The served models and which requests each answers: one helper checks a request's model name.

`app.state.served_models` are the generative models (name -> ServedModel, MODEL_DIRS' order, plus
those loaded at run time); `app.state.model_name` is the first, the default one (TGI's `POST /`, a
request without a model); `app.state.lora_adapters`
the LoRA adapters served on it by name (each also a generative model: the name selects the adapter),
`app.state.runtime_adapters` those loaded at run time (frontend/admin: name -> RuntimeAdapter);
`app.state.embed_model_name` the embedding model; `traits` each served model's own parsers and media.
Every OpenAI or Databricks route resolves the name it was given here, so a request for the wrong kind
of model gets the same clear 4xx everywhere.
"""

from __future__ import annotations

from typing import Literal

from fastapi import Request

from frontend.engine_client.request import Job
from frontend.engine_client.served import DEFAULT, ModelTraits, ServedModel
from frontend.errors import APIError

Task = Literal["generate", "embed"]

_WHAT = {"generate": "a text generation model", "embed": "an embedding model"}
_CANNOT = {"generate": "generate text", "embed": "make embeddings"}


def served(request: Request) -> dict[str, Task]:
    """Served model names and their task, the generative model first."""
    state = request.app.state
    models = [name for name, model in state.served_models.items() if not model.loading]
    names = (*models, *state.lora_adapters, *state.runtime_adapters)
    generative: dict[str, Task] = {name: "generate" for name in names}
    return {**generative, state.embed_model_name: "embed"}


def use_model(request: Request, job: Job, model: str | None) -> None:
    """Points `job` at the served model a resolved model name selects, or at the LoRA adapter it
    names (on the default model): one loaded at start-up by name, one loaded at run time by its
    tensors; the job's sampling defaults are that model's."""
    state = request.app.state
    job.served = served_model(request, model)
    job.defaults = traits(request, job.served).sampling
    job.lora_name = model if model in state.lora_adapters else None
    job.lora = state.runtime_adapters.get(model) if model is not None else None


def served_model(request: Request, model: str | None) -> ServedModel | None:
    """The generative model a resolved name runs on; None: the default model (also for adapters)."""
    return request.app.state.served_models.get(model) if model is not None else None


def traits(request: Request, model: ServedModel | str | None) -> ModelTraits:
    """The parsers and media of a served model (a Job's `served`), or of the one a resolved name runs
    on; None or an adapter's name: the default model's."""
    if not isinstance(model, ServedModel):
        model = served_model(request, model)
    state = request.app.state
    return (model or state.served_models[state.model_name]).traits


def triton_model(request: Request, model: str | None, kind: str) -> str:
    """The Triton name of `kind` (contract.PREPROCESSING, …) of the model a resolved name runs on."""
    return (served.models if (served := served_model(request, model)) else DEFAULT).triton_name(kind)


def resolve_model(request: Request, name: str | None, task: Task) -> str:
    """The served name of the model for `task`. `name` None means that model; a name of the other
    model gets 400, an unknown name 404 (OpenAI's model_not_found)."""
    models = served(request)
    wanted = next(n for n, t in models.items() if t == task)
    if name is None or name == wanted:
        return wanted
    loading = request.app.state.served_models.get(name)
    if loading is not None and loading.loading:  # the error handler adds Retry-After
        raise APIError(503, f"the model '{name}' is loading; retry shortly", "unavailable", param="model")
    if models.get(name) == task:  # a LoRA adapter of the generative model
        return name
    if name in models:
        raise APIError(
            400,
            f"model '{name}' is {_WHAT[models[name]]}; it cannot {_CANNOT[task]}: use '{wanted}'",
            "invalid_request_error",
            param="model",
        )
    listing = ", ".join(f"'{n}' ({_WHAT[t]})" for n, t in models.items())
    raise APIError(
        404,
        f"the model '{name}' does not exist; this server has {listing}",
        "invalid_request_error",
        param="model",
        code="model_not_found",
    )
