"""The engine's settings as the engine reads them, for routes that report them (vLLM's
`max_model_len`, TGI's `GET /info`): its config.pbtxt parameters asked of Triton, this process's
TRITONLM_* variables (the launcher shares them with tritonserver), resolved against the checkpoint.
Read once per engine. And its checkpoint's vocabulary size (the logits' width), for `logit_bias`."""

from __future__ import annotations

import functools
from dataclasses import replace

from fastapi import Request

from frontend.engine_client.served import DEFAULT, ServedModel
from frontend.errors import APIError
from tritonlm.config import ConfigError, EngineConfig, checkpoint_vocab_size
from tritonlm.contract import ENGINE


async def engine_config(request: Request, served: ServedModel | None = None) -> EngineConfig:
    """The settings of `served`'s engine (None: the default model's), read once per engine."""
    state = request.app.state
    models = served.models if served is not None else DEFAULT
    engine = models.triton_name(ENGINE)
    if getattr(state, "engine_configs", None) is None:
        state.engine_configs = {}
    cache: dict[tuple[str, str], EngineConfig] = state.engine_configs
    key = (engine, models.model_dir)  # a model loaded again from elsewhere is read again
    if key in cache:
        return cache[key]
    config = EngineConfig.from_parameters(await state.triton.model_parameters(engine))
    try:
        config = replace(config, model_dir=config.model_dir or state.model_dir).resolved()
    except (ConfigError, OSError) as error:
        raise APIError(503, f"the engine's settings cannot be read: {error}", "unavailable") from None
    cache[key] = config
    return config


async def vocab_size(request: Request, served: ServedModel | None = None) -> int | None:
    """The vocabulary size of `served`'s checkpoint (config.json's `vocab_size`: the width of its
    logits, which the engine's embedding_bias must have); None when config.json names none."""
    model_dir = (await engine_config(request, served)).model_dir
    try:
        return _checkpoint_vocab_size(model_dir)
    except (OSError, ValueError) as error:
        raise APIError(503, f"the model's config.json cannot be read: {error}", "unavailable") from None


@functools.lru_cache(maxsize=64)
def _checkpoint_vocab_size(model_dir: str) -> int | None:
    return checkpoint_vocab_size(model_dir)
