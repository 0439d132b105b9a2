"""vLLM's `POST /v1/chat/completions/render` and `POST /v1/completions/render`, for cache-aware
routers: the body of a generation request, answered with its prompt's token ids (and their text)
exactly as generation would feed them to the engine. The body is checked and prepared by the
generation routes' own code (frontend.openai_api: schema, `prepare`: the same chat template, tools,
thinking switch, media), and the prompt made by preprocessing as generation makes it, so a body that
generation refuses gets the same 400 here, and `token_ids` has `usage.prompt_tokens` ids.

The answer follows vLLM's (its GenerateRequest): one object for a chat, a list for completions (one
per prompt_embeds tensor), each with `request_id`, `model`, `token_ids`, `features` (vLLM's media
features: always null, as media and prompt_embeds rows are among the ids, past the vocabulary) and
this server's `prompt`, the ids' text with special tokens (null when rows with no text are among
them); vLLM's `sampling_params` (its engine's own object) are not given.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request

from frontend.engine_client.request import Job
from frontend.engine_client.steps import prompt_tokens
from frontend.engine_info import vocab_size
from frontend.models import resolve_model, traits
from frontend.openai_api.routes import completion_jobs, prepare
from frontend.openai_api.schema import ChatCompletionRequest, CompletionRequest
from frontend.streaming import until_disconnected
from frontend.tokenize.routes import decode

router = APIRouter()


@router.post("/v1/chat/completions/render")
async def render_chat(req: ChatCompletionRequest, request: Request) -> dict[str, Any]:
    model = resolve_model(request, req.model, "generate")
    job = req.to_job(traits(request, model).reasoning_parser)
    await prepare(request, model, [job], chat=True)
    return await _rendered(request, model, job, "chatcmpl")


@router.post("/v1/completions/render")
async def render_completion(req: CompletionRequest, request: Request) -> list[dict[str, Any]]:
    model = resolve_model(request, req.model, "generate")
    jobs = await completion_jobs(req)
    await prepare(request, model, jobs, chat=False)
    return [await _rendered(request, model, job, "cmpl") for job in jobs]


async def _rendered(request: Request, model: str, job: Job, id_prefix: str) -> dict[str, Any]:
    prompt = await until_disconnected(request, prompt_tokens(request.app.state.triton, job))
    vocab = await vocab_size(request, job.served)
    text = None
    if vocab is None or all(i < vocab for i in prompt.ids):  # rows past the vocabulary have no text
        text = await until_disconnected(request, decode(request, model, prompt.ids))
    return {
        "request_id": f"{id_prefix}-{uuid.uuid4().hex}",
        "model": model,
        "token_ids": prompt.ids,
        "features": None,
        "prompt": text,
    }
