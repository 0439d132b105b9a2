"""The rules the APIs share, each in one home: the sampling defaults, each sequence's seed, and a
stream's error event once its headers are sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from frontend.engine_client.request import Job
from frontend.errors import APIError
from frontend.streaming import with_error_event
from tritonlm.sampling.seeds import SEED_SPACE, sequence_seed


def test_a_request_without_temperature_or_top_p_samples_at_one():
    """Where the model has no defaults (frontend.sampling_defaults: its tests)."""
    values = Job(prompt="Hi").values()
    assert (values["temperature"], values["runtime_top_p"]) == (1.0, 1.0)
    values = Job(prompt="Hi", temperature=0.5, top_p=0.5).values()
    assert (values["temperature"], values["runtime_top_p"]) == (0.5, 0.5)


def test_sequence_i_of_a_job_draws_with_seed_plus_i():
    assert sequence_seed(None, 3) is None
    assert sequence_seed(SEED_SPACE - 1, 2) == 1  # random_seed is a UINT64: it wraps
    job = Job(prompt="Hi", seed=SEED_SPACE - 1)
    assert [job.values(i)["random_seed"] for i in range(3)] == [SEED_SPACE - 1, 0, 1]


class _Upstream:
    closed = False

    async def aclose(self) -> None:
        self.closed = True


def _run(events: AsyncGenerator[str, None], upstream: _Upstream) -> list[str]:
    async def collect() -> list[str]:
        return [
            e async for e in with_error_event(events, upstream, lambda exc: f"{exc.status} {exc.message}")
        ]

    return asyncio.run(collect())


def test_a_failure_after_the_headers_ends_the_stream_with_the_apis_error_event():
    async def refused() -> AsyncGenerator[str, None]:
        yield "a"
        raise APIError(400, "too long")

    async def broken() -> AsyncGenerator[str, None]:
        yield "a"
        raise RuntimeError("a bug")

    for events, last in ((refused(), "400 too long"), (broken(), "500 internal server error")):
        upstream = _Upstream()
        assert _run(events, upstream) == ["a", last]
        assert upstream.closed


def test_a_stream_that_ends_well_is_passed_on_and_closes_its_upstream():
    async def fine() -> AsyncGenerator[str, None]:
        yield "a"
        yield "b"

    upstream = _Upstream()
    assert _run(fine(), upstream) == ["a", "b"]
    assert upstream.closed
