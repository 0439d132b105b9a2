"""A request's media onto its Job: checked against the media its served model takes and the limits,
fetched concurrently with the app's `MediaSources`, every refusal an `APIError` naming the part (400,
or 413 over a byte limit) in the route's own error format."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fastapi import Request

from frontend.engine_client.request import Job, MediaItem
from frontend.errors import APIError
from frontend.media.parts import MediaRef
from frontend.media.sources import MediaSources
from frontend.models import traits
from frontend.streaming import until_disconnected
from tritonlm.multimodal.limits import MediaError

# How each kind is sent, for messages that tell a client what the model takes.
_PART_TYPES = {"image": "image_url", "video": "video_url", "audio": "audio_url or input_audio"}


async def attach(request: Request, job: Job, refs: Sequence[MediaRef], field: str, *, chat: bool) -> None:
    """Fill `job.media` from `refs`. `field`: the request field that holds the parts (`messages`,
    `inputs`), named when there are too many; `chat`: the chat APIs' byte limits."""
    if not refs:
        return
    sources: MediaSources = request.app.state.media
    try:
        check(refs, traits(request, job.served).media_kinds, sources.limits.max_items, field)
        job.media = await until_disconnected(request, fetch_all(sources, refs, chat=chat))
    except MediaError as error:
        raise as_api_error(error) from None


def check(refs: Sequence[MediaRef], kinds: Sequence[str], max_items: int, field: str) -> None:
    """What the model and the item limit allow, before anything is fetched."""
    if refs and not kinds:
        ref = refs[0]
        raise MediaError(
            ref.part,
            f"type {ref.type!r}: this model is text-only, content parts must be "
            '{"type": "text", "text": "..."}',
        )
    if len(refs) > max_items:
        raise MediaError(
            field,
            f"at most {max_items} image_url, video_url and audio_url parts per request (MEDIA_MAX_ITEMS), "
            f"got {len(refs)}",
        )
    for ref in refs:
        if ref.kind not in kinds:
            accepted = ", ".join(f"{kind} ({_PART_TYPES[kind]})" for kind in kinds)
            raise MediaError(ref.part, f"type {ref.type!r}: this model takes no {ref.kind}, only {accepted}")


async def fetch_all(sources: MediaSources, refs: Sequence[MediaRef], *, chat: bool) -> tuple[MediaItem, ...]:
    """Every item's bytes, fetched concurrently; the first refusal in prompt order is raised and
    the other fetches are cancelled."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(sources.load(r.source, r.kind, r.part, chat=chat)) for r in refs]
    except ExceptionGroup as failed:
        refusals = [e for e in failed.exceptions if isinstance(e, MediaError)]
        if len(refusals) < len(failed.exceptions):
            raise
        order = {ref.part: i for i, ref in enumerate(refs)}
        raise min(refusals, key=lambda e: order.get(e.part, len(order))) from None
    return tuple(MediaItem(r.kind, t.result(), r.part) for r, t in zip(refs, tasks, strict=True))


def as_api_error(error: MediaError) -> APIError:
    # "validation": TGI's error_type for a bad request; OpenAI's routes derive their type from 400.
    kind = "validation" if error.status == 400 else None
    return APIError(error.status, str(error), kind, param=error.part)
