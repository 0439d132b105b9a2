"""OpenAI's Responses API: `POST /v1/responses` (whole or streamed as semantic events),
`GET /v1/responses/{id}` and `DELETE /v1/responses/{id}` of stored responses.

A request walks: schema (validation) → convert (items → a chat Job, after the stored conversation it
continues) → the chat path's media attach and tool guides → the engine client (one sequence) →
format (output items read by the chat reply reader; the response object or its events) → store.
Errors are raised and rendered by frontend.errors, in OpenAI's shape.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from frontend.chat_tools.reply import reply_reader
from frontend.engine_client.steps import Generation, Step, first, generate, steps, unfinished
from frontend.errors import APIError, openai_body
from frontend.media.attach import attach
from frontend.models import resolve_model, traits, use_model
from frontend.openai_api.schema import bad_request, guide_calls_in_prompt
from frontend.responses.convert import Turn, to_turn
from frontend.responses.format import Envelope, Event, Output, closing, whole
from frontend.responses.schema import ResponsesRequest
from frontend.responses.store import ResponseStore, Stored
from frontend.streaming import EventStream, until_disconnected, with_error_event

router = APIRouter()


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses_store


@router.post("/v1/responses")
async def create_response(req: ResponsesRequest, request: Request) -> Response:
    state = request.app.state
    model = resolve_model(request, req.model, "generate")
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        history = _store(request).get(req.previous_response_id, "previous_response_id").conversation
    parsers = traits(request, model)
    turn = to_turn(req, history, parsers.reasoning_parser)
    job = turn.job
    use_model(request, job, model)
    if parsers.tools_in_prompt:
        guide_calls_in_prompt(job)
    await attach(request, job, turn.refs, "input", chat=True)
    reader = reply_reader(job.tools, job.chat_template_kwargs, parsers.tool_parser, parsers.reasoning_parser)
    envelope, output = Envelope(req, model, job.defaults), Output(reader, job.logprobs)
    if not job.stream:
        gen = await until_disconnected(request, generate(state.triton, job))
        body = whole(envelope, output, gen)
        _remember(request, req, history, turn, body)
        return JSONResponse(body)
    upstream = steps(state.triton, job)
    # The first response before the headers: errors the models report still get their HTTP status.
    head = await until_disconnected(request, first(upstream))
    events = _events(request, req, history, turn, envelope, output, head, upstream)
    return EventStream(_numbered(with_error_event(events, upstream, _error_event)), upstream=upstream)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    _no_query(request)
    return _store(request).get(response_id).response


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    _no_query(request)
    _store(request).delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def _no_query(request: Request) -> None:
    for name in request.query_params:  # OpenAI's stream / include / starting_after: not served
        raise bad_request("not supported by this server", name)


def _remember(
    request: Request, req: ResponsesRequest, history: list[dict[str, Any]], turn: Turn, body: dict[str, Any]
) -> None:
    if req.store is not False:
        conversation = [*history, *turn.items, *json.loads(json.dumps(body["output"]))]
        _store(request).put(Stored(body, conversation))


def _sse(event: Event) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _numbered(events: AsyncGenerator[Event, None]) -> AsyncIterator[bytes]:
    """The stream's events as sent: each with its `sequence_number`, from 0."""
    sequence = itertools.count()
    async with contextlib.aclosing(events):
        async for event in events:
            yield _sse({**event, "sequence_number": next(sequence)})


def _error_event(exc: APIError) -> Event:
    error = openai_body(exc)["error"]
    return {"type": "error", "code": error["code"], "message": error["message"], "param": error["param"]}


async def _events(
    request: Request,
    req: ResponsesRequest,
    history: list[dict[str, Any]],
    turn: Turn,
    envelope: Envelope,
    output: Output,
    head: Step,
    upstream: AsyncGenerator[Step, None],
) -> AsyncGenerator[Event, None]:
    """The stream: created, in_progress, each item's events as the reply is read, then completed (or
    incomplete) with the whole response (numbered by `_numbered`; `with_error_event` adds an `error`
    event if generation fails)."""
    gen = Generation()
    for kind in ("response.created", "response.in_progress"):
        yield {"type": kind, "response": envelope.body("in_progress", [], None)}
    step: Step | None = head
    while step is not None:
        gen.add(step)
        part = output.reader.feed(step.text)
        if step.finish_reason:
            part += output.reader.finish()
        for event in output.feed(part, step.tokens):
            yield event
        step = None if step.finish_reason else await anext(upstream, None)
    if not gen.finish_reason:
        raise unfinished()
    last, body = closing(envelope, output, gen)
    for event in last:
        yield event
    _remember(request, req, history, turn, body)
    yield {"type": f"response.{body['status']}", "response": body}
