"""Stream coalescing: when the sender falls behind the engine (many streams on few cores), the
reports waiting for a stream become one response instead of a backlog of one-token responses
(what vLLM's output processor does with the outputs it finds queued)."""

from __future__ import annotations

from typing import Protocol, TypeVar


class _Keyed(Protocol):
    key: int


S = TypeVar("S", bound=_Keyed)
# (sequence, first new token, end, finish reason) as the engine reported them; None stops the sender
Report = tuple[S, int, int, str]


def coalesce(reports: list[Report | None]) -> list[Report | None]:
    """One report per sequence, spanning all of its tokens in `reports`, in order of first
    appearance, with the latest finish reason; a stop marker (None) stays, last."""
    merged: dict[int, Report] = {}
    for report in reports:
        if report is None:
            continue
        seq, first, end, finish_reason = report
        earlier = merged.get(seq.key)
        merged[seq.key] = (seq, earlier[1] if earlier else first, end, finish_reason)
    return [*merged.values(), *([None] if None in reports else [])]
