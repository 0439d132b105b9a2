"""`POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`: vLLM's routes, bodies, statuses
and messages (400 for a name already loaded, 404 for one that cannot be found), answered in OpenAI's
error format naming the field.

Loading reads a PEFT directory under LORA_ALLOWED_DIRS into TensorRT-LLM's tensors (the start-up
adapters' conversion, tritonlm/lora/format.py), checks them on the engine with a one-token request
(which also leaves them in its task cache), and serves them under `lora_name` on every API that
takes a model (frontend/engine_client/lora.py says how requests carry them to each replica).
Unloading takes the name away at once (new requests get 404 naming the model) and answers when the
adapter's running requests have finished; the frontend then forgets the tensors and the engine's LRU
cache drops them when it needs the room.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, field_validator
from starlette.responses import PlainTextResponse

from frontend.engine_client.lora import RuntimeAdapter
from frontend.engine_client.request import Job
from frontend.engine_client.steps import generate
from frontend.errors import APIError, invalid_request
from frontend.field_rules import resolved_under
from frontend.models import served
from tritonlm.lora.format import AdapterFormatError, check_adapter_name, peft_to_tensors

log = logging.getLogger(__name__)
router = APIRouter()


def _name(value: str) -> str:
    try:
        check_adapter_name(value)
    except ValueError as error:
        raise ValueError(str(error).removeprefix("adapter name ")) from None
    return value


class LoadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str

    _check_name = field_validator("lora_name")(_name)


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str


def _check_name_free(request: Request, name: str) -> None:
    state = request.app.state
    if name in state.runtime_adapters or name in state.lora_adapters:
        raise invalid_request(400, f"The lora adapter '{name}' has already been loaded.", "lora_name")
    if name in served(request):
        raise invalid_request(
            400, f"'{name}' is the name of a served model: choose another lora_name", "lora_name"
        )


def _adapter_dir(request: Request, lora_path: str) -> Path:
    """`lora_path` resolved, when it is a directory under LORA_ALLOWED_DIRS."""
    roots = request.app.state.lora_allowed_dirs
    if not roots:
        message = "lora_path: loading adapters is off: the server sets no LORA_ALLOWED_DIRS"
        raise invalid_request(400, message, "lora_path")
    try:
        resolved = resolved_under(lora_path, roots)
        if resolved is None:
            raise invalid_request(400, "lora_path: the path is outside LORA_ALLOWED_DIRS", "lora_path")
        if not resolved.is_dir():
            raise invalid_request(
                404, f"lora_path: No adapter found at {lora_path!r} (not a directory)", "lora_path"
            )
    except (OSError, ValueError, RuntimeError) as error:  # NUL bytes, symlink loops, permissions
        if isinstance(error, APIError):
            raise
        raise invalid_request(400, "lora_path: the path cannot be read", "lora_path") from None
    return resolved


async def _check_on_engine(request: Request, adapter: RuntimeAdapter) -> None:
    """One greedy token with the adapter: the engine checks it against the model's projections."""
    job = Job(prompt="a", max_tokens=1, sample=False, lora=adapter)
    try:
        await generate(request.app.state.triton, job)
    except APIError as error:
        if error.status >= 500 or error.status == 429:
            raise
        message = f"lora_path: the adapter does not fit the model ({error.message})"
        raise invalid_request(400, message, "lora_path") from None


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request) -> str:
    """Serve the PEFT LoRA adapter at `lora_path` (under LORA_ALLOWED_DIRS) as the model `lora_name`."""
    name = body.lora_name
    _check_name_free(request, name)
    directory = _adapter_dir(request, body.lora_path)
    try:
        weights, config = await asyncio.to_thread(peft_to_tensors, directory)
    except AdapterFormatError as error:
        raise invalid_request(400, f"lora_path: {error}", "lora_path") from None
    adapter = RuntimeAdapter(name, str(directory), weights, config)
    await _check_on_engine(request, adapter)
    _check_name_free(request, name)  # another load of the name may have finished meanwhile
    request.app.state.runtime_adapters[name] = adapter
    log.info("LoRA adapter %r loaded from %s (task id %d)", name, directory, adapter.task_id)
    return f"Success: LoRA adapter '{name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request) -> str:
    """Stop serving `lora_name`; answers once the requests running with it have finished."""
    name = body.lora_name
    state = request.app.state
    adapter = state.runtime_adapters.pop(name, None)
    if adapter is None:
        if name in state.lora_adapters:
            message = f"The lora adapter '{name}' was loaded at start-up (LORA_MODULES): it stays."
            raise invalid_request(400, message, "lora_name")
        raise invalid_request(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
    await adapter.idle()
    log.info("LoRA adapter %r unloaded", name)
    return f"Success: LoRA adapter '{name}' removed successfully."
