"""Anthropic's Messages API: `POST /v1/messages` (a message, or its stream of events) and
`POST /v1/messages/count_tokens`. A request is checked (anthropic.schema), turned into a chat Job
(anthropic.convert), its images fetched (frontend.media), and run on the one generation path
(frontend.engine_client); the reply is read by the chat path's reply reader into Anthropic's blocks
(anthropic.format). Errors are rendered by frontend.errors in Anthropic's shape.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from frontend.anthropic.convert import create_job, prompt_job
from frontend.anthropic.format import MessageFormat, MessageStream, sse_event
from frontend.anthropic.schema import CountTokensRequest, MessagesRequest
from frontend.engine_client.request import Job
from frontend.engine_client.steps import Step, first, generate, prompt_tokens, steps, unfinished
from frontend.errors import APIError, anthropic_body
from frontend.media.attach import attach
from frontend.media.parts import MediaRef
from frontend.models import resolve_model, traits, use_model
from frontend.openai_api.schema import guide_calls_in_prompt
from frontend.streaming import EventStream, until_disconnected, with_error_event

router = APIRouter()


async def _prepared(request: Request, job: Job, refs: list[MediaRef], model: str) -> Job:
    """The job as the chat path runs it: the LoRA adapter its model names, calls held to the
    tools when the template knows none, its images fetched (refused for a text-only model)."""
    use_model(request, job, model)
    if traits(request, job.served).tools_in_prompt:
        guide_calls_in_prompt(job)
    await attach(request, job, refs, "messages", chat=True)
    return job


@router.post("/v1/messages")
async def create_message(req: MessagesRequest, request: Request) -> Response:
    model = resolve_model(request, req.model, "generate")
    job = await _prepared(request, *create_job(req), model)
    state = request.app.state
    parsers = traits(request, job.served)
    fmt = MessageFormat(model, parsers.tool_parser, parsers.reasoning_parser)
    if not job.stream:
        gen = await until_disconnected(request, generate(state.triton, job))
        return JSONResponse(fmt.message(gen, job))
    upstream = steps(state.triton, job)
    # The first response before the headers: errors the models report keep their HTTP status.
    head = await until_disconnected(request, first(upstream))
    events = with_error_event(_events(MessageStream(fmt, job), head, upstream), upstream, _error_event)
    return EventStream(events, upstream=upstream)


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, request: Request) -> dict[str, int]:
    """The prompt's tokens as preprocessing renders them for a create of the same request (its
    `input_tokens` + `cache_read_input_tokens`)."""
    model = resolve_model(request, req.model, "generate")
    job = await _prepared(request, *prompt_job(req), model)
    prompt = await until_disconnected(request, prompt_tokens(request.app.state.triton, job))
    return {"input_tokens": len(prompt.ids)}


async def _events(
    stream: MessageStream, head: Step, upstream: AsyncGenerator[Step, None]
) -> AsyncGenerator[bytes, None]:
    step: Step | None = head
    while step is not None:
        for kind, data in stream.push(step):
            yield sse_event(kind, data)
        step = await anext(upstream, None)
    if not stream.done:
        raise unfinished()


def _error_event(exc: APIError) -> bytes:
    return sse_event("error", anthropic_body(exc))
