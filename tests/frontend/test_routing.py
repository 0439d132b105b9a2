"""Router policy alone, and the Router over fake replicas (retry, error mid-stream, health, metrics)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from frontend.errors import APIError
from frontend.routing import is_multi
from frontend.routing.policy import Policy, block_hashes
from frontend.routing.router import Endpoints, Router, parse_urls


def test_block_hashes_are_chained_prefixes():
    a, b = block_hashes(list(range(40)), 16), block_hashes(list(range(32)) + [9] * 8, 16)
    assert len(a) == 2 and a == b  # the partial last block is ignored
    assert block_hashes([1] * 16 + [2] * 16, 16)[1] != block_hashes([3] * 16 + [2] * 16, 16)[1]


def test_least_outstanding_spreads_load():
    policy = Policy()
    policy.set_replicas(["a", "b"])
    for _ in range(4):
        policy.started(policy.choose().replica)
    assert [s.outstanding for s in policy.replicas.values()] == [2, 2]
    policy.finished("b")
    assert policy.choose().replica == "b"


def test_shared_prefix_goes_to_the_same_replica_until_it_is_too_busy():
    policy = Policy(block_size=4, min_blocks=2, imbalance=2)
    policy.set_replicas(["a", "b"])
    prefix = list(range(100, 120))
    first = policy.choose(prefix + [1, 2, 3, 4])
    assert not first.affinity
    policy.started(first.replica)
    second = policy.choose(prefix + [5, 6, 7, 8])
    assert second == type(second)(first.replica, True)
    for _ in range(3):
        policy.started(first.replica)
    assert policy.choose(prefix).replica != first.replica  # load wins past `imbalance`
    assert not policy.choose(list(range(4))).affinity  # fewer than min_blocks shared


def test_unhealthy_replicas_are_skipped_and_forget_their_prefixes():
    policy = Policy(block_size=4)
    policy.set_replicas(["a", "b"])
    prompt = list(range(16))
    chosen = policy.choose(prompt).replica
    policy.mark(chosen, False)
    other = policy.choose(prompt)
    assert other.replica != chosen and not other.affinity
    policy.mark(other.replica, False)
    assert policy.choose(prompt) is None
    policy.mark(chosen, True)
    assert policy.choose(prompt) == type(other)(chosen, False)  # its cache was lost with it
    assert policy.choose(exclude=[chosen]) is None


def test_parse_urls():
    assert parse_urls("h1:1, h2:2") == Endpoints(urls=("h1:1", "h2:2"))
    assert parse_urls("dns+triton-headless.ns.svc:8001") == Endpoints(
        dns_name="triton-headless.ns.svc", port=8001
    )
    for bad in ("", "dns+name", "dns+:80"):
        with pytest.raises(ValueError):
            parse_urls(bad)
    assert is_multi("a:1,b:2") and is_multi("dns+x:1") and not is_multi("localhost:8001")


class FakeReplica:
    def __init__(self, name: str, fail_after: int | None = None) -> None:
        self.name, self.fail_after, self.up, self.calls = name, fail_after, True, 0

    async def ready(self, models) -> bool:
        return self.up

    async def infer(self, model, inputs):
        self.calls += 1
        if not self.up:
            raise APIError(503, "inference server unavailable: connection refused")
        return {"from": np.array([self.name])}

    async def stream(self, model, inputs, outputs=None):
        self.calls += 1
        for i in range(3):
            if not self.up or (self.fail_after is not None and i >= self.fail_after):
                raise APIError(503, "inference server unavailable: [StatusCode.UNAVAILABLE]")
            yield {"from": np.array([self.name]), "i": np.array([i])}


def _router(replicas: dict[str, FakeReplica]) -> Router:
    registry = CollectorRegistry()
    return Router(
        Endpoints(urls=tuple(replicas)), make_client=lambda url, sid: replicas[url], registry=registry
    )


def _metric(router: Router, name: str, replica: str) -> float:
    return router.metrics.registry.get_sample_value(name, {"replica": replica}) or 0.0


def test_router_retries_a_request_whose_replica_died_before_the_first_response():
    replicas = {"r1:1": FakeReplica("r1"), "r2:1": FakeReplica("r2")}
    replicas["r1:1"].up = False
    router = _router(replicas)
    failures = _metric(router, "tritonlm_router_failures_total", "r1:1")

    async def run():
        streamed = [o async for o in router.stream("engine", {"input_ids": np.arange(40)})]
        assert {str(o["from"][0]) for o in streamed} == {"r2"} and len(streamed) == 3
        replicas["r1:1"].up = True
        assert await router.ready(["engine"])  # probed back in
        assert router.policy.replicas["r1:1"].healthy
        inferred = {str((await router.infer("preprocessing", {}))["from"][0]) for _ in range(4)}
        assert inferred == {"r1", "r2"}

    asyncio.run(run())
    assert _metric(router, "tritonlm_router_failures_total", "r1:1") == failures + 1
    assert _metric(router, "tritonlm_router_outstanding", "r1:1") == 0
    assert _metric(router, "tritonlm_router_outstanding", "r2:1") == 0


def test_a_started_stream_that_cannot_be_resumed_ends_with_the_error_and_nothing_is_retried():
    # Streams that can be resumed on another replica are tests/engine/test_failover.py's.
    replicas = {"s1:1": FakeReplica("s1", fail_after=1), "s2:1": FakeReplica("s2", fail_after=1)}
    router = _router(replicas)

    async def run():
        got = []
        with pytest.raises(APIError) as caught:
            beams = {"input_ids": np.arange(8), "beam_width": np.array([2], np.int32)}
            async for out in router.stream("engine", beams):
                got.append(out)
        assert caught.value.status == 503 and len(got) == 1
        assert "a beam search cannot be resumed" in caught.value.message
        assert sum(r.calls for r in replicas.values()) == 1

    asyncio.run(run())


def test_affinity_hits_are_counted_per_replica():
    replicas = {"a1:1": FakeReplica("a1"), "a2:1": FakeReplica("a2")}
    router = _router(replicas)
    prompt = {"input_ids": np.arange(64).reshape(1, -1)}

    async def run():
        return [str((await router.infer("engine", prompt))["from"][0]) for _ in range(3)]

    names = asyncio.run(run())
    assert len(set(names)) == 1
    assert _metric(router, "tritonlm_router_prefix_affinity_hits_total", f"{names[0]}:1") == 2
    assert _metric(router, "tritonlm_router_requests_total", f"{names[0]}:1") == 3


def test_dns_endpoints_follow_the_names_addresses():
    made: dict[str, FakeReplica] = {}

    def make(url: str, sid: str | None) -> FakeReplica:
        made[url] = FakeReplica(url)
        return made[url]

    router = Router(
        Endpoints(dns_name="localhost", port=28999), make_client=make, registry=CollectorRegistry()
    )
    assert router.clients == {}

    async def run():
        await router.probe(["engine"])
        assert "127.0.0.1:28999" in router.clients
        assert all(s.healthy for s in router.policy.replicas.values())
        router.endpoints = Endpoints(dns_name="no-such-host.invalid", port=28999)
        await router.probe(["engine"])  # a failed lookup keeps the replicas known so far
        assert "127.0.0.1:28999" in router.clients

    asyncio.run(run())
