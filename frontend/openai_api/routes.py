"""OpenAI-compatible text generation: `POST /v1/chat/completions` and
`POST /v1/completions`. A request walks: the route validates its body (openai_api.schema)
into Jobs and picks the response `Format` (chat_format, completion_format); `serve` runs the Jobs
(openai_api.jobs: each sequence through the engine client, frontend.engine_client) and answers in
that format, whole or streamed. APIs built on these shapes call `serve` with their own schema and
format. Errors are raised and rendered by frontend.errors, in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from frontend.engine_client.request import Job
from frontend.engine_client.steps import Prompt, Step, first, prompt_tokens, unfinished
from frontend.engine_info import vocab_size
from frontend.errors import APIError, openai_body
from frontend.media.attach import attach
from frontend.media.parts import chat_media
from frontend.models import resolve_model, traits, use_model
from frontend.openai_api.chat_format import ChatFormat
from frontend.openai_api.completion_format import CompletionFormat
from frontend.openai_api.fields import embedding_bias
from frontend.openai_api.format import Format, Stream
from frontend.openai_api.jobs import complete_all, stream_all
from frontend.openai_api.schema import ChatCompletionRequest, CompletionRequest, guide_calls_in_prompt
from frontend.streaming import EventStream, sse, until_disconnected, with_error_event

router = APIRouter()
DONE = b"data: [DONE]\n\n"


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    model = resolve_model(request, req.model, "generate")
    parsers = traits(request, model)
    fmt = ChatFormat(
        model,
        full_text=request.app.state.stream_full_text,
        tool_parser=parsers.tool_parser,
        reasoning_parser=parsers.reasoning_parser,
    )
    return await serve(request, fmt, [req.to_job(parsers.reasoning_parser)])


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request) -> Response:
    model = resolve_model(request, req.model, "generate")
    fmt = CompletionFormat(model, full_text=request.app.state.stream_full_text)
    return await serve(request, fmt, await completion_jobs(req))


async def completion_jobs(req: CompletionRequest) -> list[Job]:
    # Loading prompt_embeds tensors (up to 16 MiB) runs off the event loop, which serves everyone.
    return await asyncio.to_thread(req.to_jobs) if req.prompt_embeds else req.to_jobs()


async def prepare(request: Request, model: str, jobs: list[Job], chat: bool) -> None:
    """What each job needs before the models see it, the same for generating and for rendering its
    prompt (frontend.tokenize): its served model (the name may be a LoRA adapter's), the guide of
    tools written into the prompt, its media fetched, logit_bias checked against the vocabulary."""
    for job in jobs:
        use_model(request, job, model)
        if chat and traits(request, job.served).tools_in_prompt:
            guide_calls_in_prompt(job)
        if job.messages is not None:  # media parts: placeholders for the template, bytes fetched
            job.messages, refs = chat_media(job.messages)
            await attach(request, job, refs, "messages", chat=True)
        if job.logit_bias:
            job.embedding_bias = embedding_bias(job.logit_bias, await vocab_size(request, job.served))


async def serve(request: Request, fmt: Format, jobs: list[Job]) -> Response:
    """Run `jobs` (answered together) and respond in `fmt`: one JSON body, or an SSE stream that
    ends with `data: [DONE]`. Whatever the client leaves early is cancelled in Triton."""
    triton = request.app.state.triton
    await prepare(request, fmt.model, jobs, chat=isinstance(fmt, ChatFormat))
    prompts: list[Prompt | None] = [None] * len(jobs)
    if any(fmt.lists_prompt(job) for job in jobs):
        prompts = await until_disconnected(request, _prompts(triton, fmt, jobs))
    if not jobs[0].stream:
        choices = await until_disconnected(request, complete_all(triton, jobs))
        return JSONResponse(fmt.response(jobs, choices, prompts))
    stream = Stream(fmt, jobs, prompts)
    if any(job.beam_search for job in jobs):  # beams are known only at the end: one chunk
        choices = await until_disconnected(request, complete_all(triton, jobs))
        return EventStream(_whole(stream.whole(choices)))
    upstream = stream_all(triton, jobs)
    # Wait for the first response before answering, so that errors Triton reports for the request
    # (a prompt too long, …) still get their HTTP status instead of an SSE error event.
    head = await until_disconnected(request, first(upstream))
    events = with_error_event(_events(stream, head, upstream), upstream, _error_event)
    return EventStream(events, upstream=upstream)


async def _prompts(triton: Any, fmt: Format, jobs: list[Job]) -> list[Prompt | None]:
    async def one(job: Job) -> Prompt | None:
        return await prompt_tokens(triton, job) if fmt.lists_prompt(job) else None

    return list(await asyncio.gather(*(one(job) for job in jobs)))


async def _whole(chunk: dict[str, Any]) -> AsyncIterator[bytes]:
    yield sse(chunk)
    yield DONE


async def _events(
    stream: Stream, first: tuple[int, Step], upstream: AsyncGenerator[tuple[int, Step], None]
) -> AsyncGenerator[bytes, None]:
    item: tuple[int, Step] | None = first
    while item is not None:
        yield sse(stream.push(*item))
        item = await anext(upstream, None)
    if not stream.done:
        raise unfinished()
    yield DONE


def _error_event(exc: APIError) -> bytes:
    return sse(openai_body(exc)) + DONE  # a failed stream ends with [DONE] too
