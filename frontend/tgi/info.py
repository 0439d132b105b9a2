"""TGI's `GET /info`: what TGI's Info reports, filled from what this server knows (the engine's
settings as it reads them, frontend.engine_info) and null where a field is optional and we have no
such thing (a model revision, a build sha, a Docker label)."""

from __future__ import annotations

import asyncio
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from fastapi import Request

from frontend.engine_info import engine_config
from frontend.field_rules import MAX_INT32
from frontend.tgi.schema import MAX_STOP_ITEMS
from tritonlm.config import EngineConfig

ROUTER = "tritonlm-frontend"  # TGI names its router here; ours is this FastAPI frontend


def served_dtype(config: EngineConfig) -> tuple[str, str]:
    """The weights' dtype and the device type as the engine resolves `dtype` and `device` on this
    machine (the launcher runs both there)."""
    import torch  # here only: the frontend imports torch only where it needs it

    saved = None
    if config.model_dir:
        checkpoint = json.loads((Path(config.model_dir) / "config.json").read_text())
        name = checkpoint.get("torch_dtype") or checkpoint.get("dtype")
        saved = getattr(torch, name, None) if isinstance(name, str) else None
    device = config.torch_device()
    return str(config.torch_dtype(device, saved)), device.type  # "torch.float32", as TGI reports it


async def info(request: Request) -> dict[str, Any]:
    state = request.app.state
    config = await engine_config(request)
    if not hasattr(state, "served_dtype"):
        state.served_dtype = await asyncio.to_thread(served_dtype, config)
    dtype, device = state.served_dtype
    return {
        "model_id": state.model_name,
        "model_sha": None,
        "model_dtype": dtype,
        "model_device_type": device,
        "model_pipeline_tag": "text-generation",
        # Requests the engine takes before refusing with 429: those it runs and those it queues.
        "max_concurrent_requests": config.max_num_seqs + config.max_queue_size
        if config.max_queue_size
        else MAX_INT32,
        "max_best_of": 1,  # TGI's best_of is not a parameter of these routes
        "max_stop_sequences": MAX_STOP_ITEMS,
        "max_input_tokens": config.max_seq_len - 1,
        "max_input_length": config.max_seq_len - 1,  # TGI 1's name of max_input_tokens
        "max_total_tokens": config.max_seq_len,
        "validation_workers": 1,  # preprocessing, one instance, tokenizes every request
        "max_client_batch_size": 1,  # one input per request
        "router": ROUTER,
        "version": metadata.version("tritonlm"),
        "sha": None,
        "docker_label": None,
    }
