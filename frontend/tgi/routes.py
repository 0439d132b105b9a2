"""TGI-compatible text generation: `POST /` (JSON in, one JSON list or an SSE stream out), and
TGI's `POST /generate` (one JSON object), `POST /generate_stream` (the SSE stream) and `GET /info`
(frontend.tgi.info), the same generation under TGI's other routes.

The route validates (tgi_schema), turns the parameters into ensemble inputs (`plan`), and shapes the
ensemble's steps into TGI's JSON; errors are raised, and rendered by frontend.errors.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from frontend.engine_client.guides import tgi_grammar
from frontend.engine_client.request import Job
from frontend.engine_client.steps import (
    Generation,
    Step,
    Token,
    Triton,
    first,
    generate,
    prompt_tokens,
    steps,
    unfinished,
)
from frontend.errors import APIError
from frontend.media.attach import attach
from frontend.media.parts import text_of, tgi_media
from frontend.models import traits, use_model
from frontend.streaming import EventStream, sse, until_disconnected, with_error_event
from frontend.tgi.info import info
from frontend.tgi.schema import ADAPTER_NONE, DEFAULT_MAX_NEW_TOKENS, GenerateRequest

router = APIRouter()

# The engine's finish reasons in TGI's words. Seed 000 files a cancelled/stopped request under
# "stop_sequence".
FINISH_REASONS = {
    "end_id": "eos_token",
    "stop_words": "stop_sequence",
    "length": "length",
    "cancelled": "stop_sequence",
}
# A random seed the frontend picks when sampling without one; 32 bits, like the seeds in TGI's `POST /`
# examples, so JavaScript clients can send it back exactly.
_SEED_RANGE = 2**32 - 1


def get_triton(request: Request) -> Triton:
    return request.app.state.triton


def plan(req: GenerateRequest) -> Job:
    """The Job for a request. Only what the request decides is set: it samples only by TGI's rule
    (greedy otherwise), and then the model's defaults fill what it leaves out (Job.sampling). A
    sampling request without a seed gets one here, so `details` can report it."""
    p = req.parameters
    sample = req.is_sampling()
    seed = None
    if sample:
        seed = p.seed if p.seed is not None else secrets.randbelow(_SEED_RANGE) + 1
    prompt_parts = None
    if isinstance(req.inputs, list):  # multimodal: preprocessing renders the parts, no template
        prompt_parts, _ = tgi_media(_dumped(req))
    return Job(
        prompt=req.inputs if isinstance(req.inputs, str) else None,
        prompt_parts=prompt_parts,
        max_tokens=p.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        stream=req.stream,
        token_special=True,
        sample=sample,
        temperature=p.temperature if sample else None,
        top_p=p.top_p if sample else None,
        top_k=p.top_k if sample else None,
        typical_p=p.typical_p if sample else None,
        seed=seed,
        repetition_penalty=p.repetition_penalty,
        watermark=bool(p.watermark),
        stop=list(p.stop or []),
        truncate=p.truncate,
        logprobs=0 if p.details or p.decoder_input_details else None,  # the chosen tokens' only
        guide=tgi_grammar(p.grammar),
        priority=p.priority or 0,
        prompt_param="inputs",
        max_tokens_param="max_new_tokens",
        guide_param="parameters.grammar",
    )


def _dumped(req: GenerateRequest) -> list[dict[str, Any]]:
    return [part.model_dump() for part in req.inputs]


async def _media(request: Request, req: GenerateRequest, job: Job) -> None:
    """A list `inputs`: only for a multimodal model; its media fetched onto the job."""
    if isinstance(req.inputs, str):
        return
    _, refs = tgi_media(_dumped(req))
    if not traits(request, job.served).media_kinds:
        raise APIError(
            400,
            f"{refs[0].part if refs else 'inputs'}: this model is text-only: inputs must be a string, "
            "not a multimodal list",
            "validation",
            param=refs[0].part if refs else "inputs",
        )
    await attach(request, job, refs, "inputs", chat=False)


def _full_text(req: GenerateRequest) -> str:
    """What `return_full_text` puts before the generated text: the prompt, or a list's text parts."""
    return req.inputs if isinstance(req.inputs, str) else text_of(_dumped(req))


def _adapter(request: Request, adapter_id: str | None) -> str | None:
    """The LoRA adapter `parameters.adapter_id` names (None or "None": the base model)."""
    if adapter_id is None or adapter_id == ADAPTER_NONE:
        return None
    adapters = (*request.app.state.lora_adapters, *request.app.state.runtime_adapters)
    if adapter_id not in adapters:
        has = f"the LoRA adapters {', '.join(adapters)}" if adapters else "no LoRA adapters"
        raise APIError(
            422,
            f'parameters.adapter_id: adapter {adapter_id!r} not found; this server has {has} (or "None": '
            "the base model)",
            param="parameters.adapter_id",
        )
    return adapter_id


def _finish(reason: str) -> str:
    return FINISH_REASONS.get(reason, reason)


def _token(tok: Token) -> dict[str, Any]:
    return {"id": tok.id, "logprob": tok.logprob, "special": tok.special, "text": tok.text}


async def _prefill(triton: Triton, job: Job) -> list[dict[str, Any]]:
    """The prompt's tokens, from the preprocessing model itself (the frontend has no tokenizer).
    Prompt logprobs are not computed and whether a prompt token is special is not reported: null."""
    prompt = await prompt_tokens(triton, job)
    texts = prompt.texts
    return [
        {"id": i, "logprob": None, "special": None, "text": texts[n] if n < len(texts) else None}
        for n, i in enumerate(prompt.ids)
    ]


@router.post("/")
async def generate_text(
    req: GenerateRequest, request: Request, triton: Annotated[Triton, Depends(get_triton)]
) -> Response:
    return await serve(req, request, triton, listed=True)


@router.get("/info")
async def tgi_info(request: Request) -> dict[str, Any]:
    """TGI's Info: the model, its dtype, the token limits, this server's version."""
    return await info(request)


@router.post("/generate")
async def generate_one(
    req: GenerateRequest, request: Request, triton: Annotated[Triton, Depends(get_triton)]
) -> Response:
    """`POST /` without streaming, answered with the object itself rather than a list of one."""
    if req.stream:
        raise APIError(422, "stream: /generate answers whole; stream from /generate_stream", param="stream")
    return await serve(req, request, triton, listed=False)


@router.post("/generate_stream")
async def generate_stream(
    req: GenerateRequest, request: Request, triton: Annotated[Triton, Depends(get_triton)]
) -> Response:
    """`POST /` streamed: the same server-sent events."""
    if "stream" in req.model_fields_set and not req.stream:
        raise APIError(
            422, "stream: /generate_stream always streams; send false to /generate", param="stream"
        )
    if req.parameters.decoder_input_details:
        message = "parameters.decoder_input_details must be false when streaming"
        raise APIError(422, message, param="parameters.decoder_input_details")
    req.stream = True
    return await serve(req, request, triton, listed=False)


async def serve(req: GenerateRequest, request: Request, triton: Triton, listed: bool) -> Response:
    """Generate for `req`: an SSE stream when it streams, else its one item (`listed`: in a list,
    as `POST /` answers)."""
    p = req.parameters
    job = plan(req)
    use_model(request, job, _adapter(request, p.adapter_id))
    await _media(request, req, job)
    if req.stream:
        upstream = steps(triton, job)
        step = await until_disconnected(request, first(upstream))
        events = with_error_event(_events(req, job, step, upstream), upstream, lambda exc: sse(exc.body()))
        return EventStream(events, upstream=upstream)

    prefill = await until_disconnected(request, _prefill(triton, job)) if p.decoder_input_details else []
    gen = await until_disconnected(request, generate(triton, job))
    item: dict[str, Any] = {}
    if p.details or p.decoder_input_details:
        item["details"] = {
            "prompt_tokens": gen.prompt_tokens,
            "finish_reason": _finish(gen.finish_reason),
            "generated_tokens": len(gen.tokens),
            "prefill": prefill,
            "seed": job.seed,
            "tokens": [_token(t) for t in gen.tokens],
        }
    item["generated_text"] = (_full_text(req) if p.return_full_text else "") + gen.text
    return JSONResponse([item] if listed else item)


def _event(token_id: list[int], text: str, logprob: float | None, special: bool) -> dict[str, Any]:
    return {
        "token": {"id": token_id, "text": text, "logprob": logprob, "special": special},
        "generated_text": None,
        "details": None,
    }


def _step_events(step: Step, carry: str) -> list[dict[str, Any]]:
    """One event per token; the step's new text (after any text carried over) goes on its last."""
    events = [_event([t.id], "", t.logprob, t.special) for t in step.tokens]
    if events:
        events[-1]["token"]["text"] = carry + step.text
    return events


async def _events(
    req: GenerateRequest, job: Job, first: Step, upstream: AsyncGenerator[Step, None]
) -> AsyncGenerator[bytes, None]:
    p = req.parameters
    gen = Generation()
    carry = ""  # text that arrived without a token, sent with the next token
    step: Step | None = first
    while step is not None:
        gen.add(step)
        events = _step_events(step, carry)
        carry = "" if events else carry + step.text
        if step.finish_reason:
            if not events:  # the final response carried no token: the text still needs an event
                events = [_event([], carry, None, False)]
            events[-1]["generated_text"] = (_full_text(req) if p.return_full_text else "") + gen.text
            if p.details:
                events[-1]["details"] = {
                    "prompt_tokens": gen.prompt_tokens,
                    "finish_reason": _finish(gen.finish_reason),
                    "generated_tokens": len(gen.tokens),
                    "seed": job.seed,
                }
        for event in events:
            yield sse(event)
        if step.finish_reason:
            break
        step = await anext(upstream, None)
    else:
        raise unfinished()
    async for _ in upstream:  # let Triton's final (empty) response end the gRPC stream cleanly
        pass
