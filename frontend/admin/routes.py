"""The admin router: present only when ADMIN_API_KEY is set (as vLLM shows its LoRA routes only with
VLLM_ALLOW_RUNTIME_LORA_UPDATING), every route behind the admin key."""

from __future__ import annotations

import functools
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI

from frontend.admin import lora, models
from frontend.admin.auth import require_admin_key
from frontend.config import FrontendConfig
from frontend.model_traits import read_traits

router = APIRouter(dependencies=[Depends(require_admin_key)])
router.include_router(lora.router)
router.include_router(models.router)


def install(app: FastAPI, config: FrontendConfig) -> None:
    """The admin routes and their state; without ADMIN_API_KEY, none (their paths are 404)."""
    app.state.runtime_adapters = {}  # name -> RuntimeAdapter; the model lookup reads it always
    if not config.admin_api_key:
        return
    app.state.admin_key = config.admin_api_key.encode()
    app.state.lora_allowed_dirs = [Path(d).resolve() for d in config.lora_allowed_dirs]
    app.state.model_allowed_dirs = config.allowed_model_dirs()
    app.state.model_repository = config.model_repository
    app.state.read_traits = functools.partial(read_traits, config)  # a loaded model's parsers and media
    app.include_router(router)
