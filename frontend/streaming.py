"""Ties a request's Triton work to its HTTP connection: when the client goes away, the work is
cancelled (and with it the gRPC stream, so the engine stops generating), whether the response is
a server-sent event stream or a single JSON body."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from frontend.errors import APIError, ClientDisconnected, internal_error
from frontend.ops.tracing import note_error

T = TypeVar("T")
log = logging.getLogger(__name__)


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def with_error_event(
    events: AsyncGenerator[T, None], upstream: AsyncGenerator[Any, None], error_event: Callable[[APIError], T]
) -> AsyncIterator[T]:
    """A stream's `events`, after its headers went out: if they fail, the stream ends with the API's
    `error_event` (an APIError as it is, anything else as a 500 whose trace goes only to the log).
    `upstream`, the engine's responses that `events` reads, is closed however the stream ends."""
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
    except APIError as exc:
        note_error(exc)  # the request's span: its status said 200
        yield error_event(exc)
    except Exception:
        log.exception("stream failed after its headers were sent")
        note_error(internal_error())
        yield error_event(internal_error())
    finally:
        with contextlib.suppress(Exception):
            await upstream.aclose()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it if the client disconnects first (then ClientDisconnected).

    Starlette does not cancel a handler whose client left, so a long non-streamed generation would
    otherwise run to the end for nobody.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        # Cancelling the work closes the generator under it, whose `finally` cancels the gRPC stream.
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected()
    finally:
        watcher.cancel()
        task.cancel()  # no-op when done; reached early only if this handler itself is cancelled


class EventStream(StreamingResponse):
    """`text/event-stream` whose body iterator is always closed when the response ends.

    Starlette (ASGI spec >= 2.4) notices a gone client only when a write fails, and then leaves the
    body generator suspended; we also watch for the disconnect message and always `aclose()` the
    generator, so its `finally` cancels the Triton request without waiting for the next token.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], upstream: AsyncIterator[Any] | None = None) -> None:
        """`upstream`: an iterator `content` reads from, closed too in case `content` never started
        (a generator that never ran cannot close what it would have closed)."""
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.upstream = upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def respond() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass  # the client went away mid-write
                    group.cancel_scope.cancel()

                group.start_soon(respond)
                await _disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            for iterator in (self.body_iterator, self.upstream):
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
