"""Builds engine Sequences for tests the way the Triton adapter does: an immutable Request, then the
Sequence that runs it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tritonlm.engine.request import Request
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.params import SamplingParams


def sequence(
    prompt: Iterable[int],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    *,
    is_cancelled: Callable[[], bool] | None = None,
    stop_words: Iterable[Iterable[int]] = (),
    **request_fields: object,
) -> Sequence:
    request = Request(
        tuple(prompt),
        max_new_tokens,
        params or SamplingParams(),
        stop_words=tuple(tuple(w) for w in stop_words),
        **request_fields,
    )
    seq = Sequence(request)
    if is_cancelled is not None:
        seq.is_cancelled = is_cancelled
    return seq
