"""Several Triton replicas behind one `Triton` (infer / stream / ready), for the frontend's EngineClient.

Each call goes to the replica `Policy` chooses. A replica that answers "unavailable" (dead, not
ready, shutting down) is taken out at once and probed back in by a background task every
`probe_seconds`; a request it failed before sending anything back is retried once on another
replica, and an engine stream that already yielded is resumed on another one after the tokens it
sent (`resume.Progress`; each attempt that got further earns another), or, when it cannot be
(`resume.cannot_resume`), ends with its error (the routes turn it into the API's error event).
Replicas come from a fixed list or from a DNS name resolved every probe (a Kubernetes headless
Service: one A record per ready pod); see `parse_urls`.

Metrics per replica (`RouterMetrics`): requests routed, in flight, failures, prefix-affinity hits,
streams resumed there, healthy; in the registry given (prometheus-client's default one unless the
frontend passes its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from frontend.engine_client.steps import Triton
from frontend.engine_client.triton import MODELS, TritonClient
from frontend.errors import APIError
from frontend.routing.policy import Policy
from frontend.routing.resume import Progress, cannot_resume, lost

log = logging.getLogger(__name__)

DNS_PREFIX = "dns+"
_PROMPT_TENSOR = "input_ids"  # the engine's prompt token ids: the affinity key


class RouterMetrics:
    """Per replica: requests routed, in flight, failed as unavailable, routed by prefix affinity,
    streams resumed on it, and whether it is routed to. In `registry`: the frontend's /metrics registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        label = ["replica"]
        self.routed = Counter(
            "tritonlm_router_requests_total",
            "Requests routed to each Triton replica",
            label,
            registry=registry,
        )
        self.outstanding = Gauge(
            "tritonlm_router_outstanding",
            "Requests in flight on each Triton replica",
            label,
            registry=registry,
        )
        self.failures = Counter(
            "tritonlm_router_failures_total",
            "Requests a Triton replica failed as unavailable",
            label,
            registry=registry,
        )
        self.affinity_hits = Counter(
            "tritonlm_router_prefix_affinity_hits_total",
            "Requests routed by prompt-prefix affinity",
            label,
            registry=registry,
        )
        self.resumed = Counter(
            "tritonlm_router_resumed_streams_total",
            "Started streams resumed on each Triton replica after the one serving them failed",
            label,
            registry=registry,
        )
        self.healthy = Gauge(
            "tritonlm_router_replica_healthy", "1 while the replica is routed to", label, registry=registry
        )

    def add(self, url: str) -> None:
        """A new replica's series, at 0 until it is used: `rate()` and `increase()` over a counter
        miss its first increment otherwise, and a dashboard panel finds the series from the start."""
        for counter in (self.routed, self.failures, self.affinity_hits):
            counter.labels(url)
        self.outstanding.labels(url)
        self.healthy.labels(url).set(1)


@dataclass(frozen=True)
class Endpoints:
    """Fixed `urls`, or a DNS `name` whose addresses, each with `port`, are the replicas."""

    urls: tuple[str, ...] = ()
    dns_name: str | None = None
    port: int = 8001


def parse_urls(value: str) -> Endpoints:
    """`host:port,host:port` (fixed replicas) or `dns+name:port` (every address `name` resolves to,
    re-resolved on each probe: a headless Service's name in Kubernetes)."""
    value = value.strip()
    if value.startswith(DNS_PREFIX):
        name, _, port = value[len(DNS_PREFIX) :].rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"TRITON_URLS: expected dns+NAME:PORT, got {value!r}")
        return Endpoints(dns_name=name, port=int(port))
    urls = tuple(u.strip() for u in value.split(",") if u.strip())
    if not urls:
        raise ValueError("TRITON_URLS: no Triton address given")
    return Endpoints(urls=urls)


def _unavailable(error: APIError) -> bool:
    return error.status == 503


def _no_replica() -> APIError:
    return APIError(503, "inference server unavailable: no Triton replica is ready")


def _prompt(model: str, inputs: dict[str, np.ndarray]) -> list[int] | None:
    ids = inputs.get(_PROMPT_TENSOR)
    return None if ids is None else [int(t) for t in np.asarray(ids).reshape(-1)]


class Router:
    """A `Triton` over replicas. `make_client(url, server_id)` opens one replica's client (tests
        pass fakes); `server_ids`: the launcher's `--id` per fixed url, checked by `ready`; `registry`:
    where the metrics go (one Router per registry)."""

    def __init__(
        self,
        endpoints: Endpoints,
        policy: Policy | None = None,
        probe_seconds: float = 1.0,
        server_ids: Iterable[str | None] = (),
        make_client: Callable[[str, str | None], Triton] | None = None,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.endpoints = endpoints
        self.metrics = RouterMetrics(registry)
        self.policy = policy or Policy()
        self.probe_seconds = probe_seconds
        self._ids = dict(zip(endpoints.urls, server_ids, strict=False))
        self._make = make_client or (lambda url, sid: TritonClient(url, server_id=sid))
        self.clients: dict[str, Triton] = {}
        self._probe_task: asyncio.Task | None = None
        self._set(list(endpoints.urls))

    # --- replicas -------------------------------------------------------------------------------
    def _set(self, urls: list[str]) -> None:
        for url in urls:
            if url not in self.clients:
                self.clients[url] = self._make(url, self._ids.get(url))
                self.metrics.add(url)
        for url in [u for u in self.clients if u not in urls]:
            client = self.clients.pop(url)
            self.metrics.healthy.labels(url).set(0)
            if hasattr(client, "close"):
                asyncio.get_running_loop().create_task(client.close())
        self.policy.set_replicas(urls)

    def _mark(self, url: str, healthy: bool) -> None:
        state = self.policy.replicas.get(url)
        if state is not None and state.healthy != healthy:
            log.warning("Triton replica %s %s", url, "back in" if healthy else "taken out")
        self.policy.mark(url, healthy)
        self.metrics.healthy.labels(url).set(1 if healthy else 0)

    async def _resolve(self) -> None:
        name, port = self.endpoints.dns_name, self.endpoints.port
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            log.warning("resolving %s: %s (keeping %d replicas)", name, exc, len(self.clients))
            return
        hosts = sorted({info[4][0] for info in infos})
        self._set([f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts])

    async def probe(self, models: Iterable[str] = MODELS) -> None:
        """Re-resolve the DNS name (if any) and ask every replica whether it is ready."""
        if self.endpoints.dns_name:
            await self._resolve()
        models = tuple(models)
        urls = list(self.clients)
        results = await asyncio.gather(*(self.clients[u].ready(models) for u in urls))
        for url, ok in zip(urls, results, strict=True):
            self._mark(url, bool(ok))

    async def _probe_forever(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.probe()
            await asyncio.sleep(self.probe_seconds)

    def start(self) -> None:
        if self._probe_task is None:
            self._probe_task = asyncio.get_running_loop().create_task(self._probe_forever())

    async def close(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        for client in self.clients.values():
            if hasattr(client, "close"):
                await client.close()

    def urls(self) -> list[str]:
        """The replicas' gRPC addresses (the DNS name's current ones)."""
        return list(self.clients)

    # --- the Triton interface --------------------------------------------------------------------
    async def ready(self, models: Iterable[str]) -> bool:
        """Ready while at least one replica is (each replica's state is refreshed here too)."""
        await self.probe(models)
        return any(s.healthy for s in self.policy.replicas.values())

    async def model_parameters(self, model: str) -> dict[str, str]:
        """A model's config parameters, from the first replica that answers (every replica serves
        the same model repository)."""
        error: APIError | None = None
        replicas = self.policy.replicas
        for url in sorted(self.clients, key=lambda u: not (u in replicas and replicas[u].healthy)):
            try:
                return await self.clients[url].model_parameters(model)
            except APIError as exc:
                error = exc
        raise error or APIError(503, "no Triton replica", "unavailable")

    def _pick(self, model: str, inputs: dict[str, np.ndarray], tried: list[str]) -> str:
        choice = self.policy.choose(_prompt(model, inputs), exclude=tried)
        if choice is None:
            raise _no_replica()
        if choice.affinity:
            self.metrics.affinity_hits.labels(choice.replica).inc()
        self.policy.started(choice.replica)
        self.metrics.routed.labels(choice.replica).inc()
        self.metrics.outstanding.labels(choice.replica).inc()
        return choice.replica

    def _done(self, url: str) -> None:
        self.policy.finished(url)
        self.metrics.outstanding.labels(url).dec()

    def _failed(self, url: str) -> None:
        self.metrics.failures.labels(url).inc()
        self._mark(url, False)

    async def load(self, model: str) -> None:
        """Loads `model` on every replica (each runs the same repository)."""
        await asyncio.gather(*(client.load(model) for client in self.clients.values()))

    async def unload(self, model: str) -> None:
        await asyncio.gather(*(client.unload(model) for client in self.clients.values()))

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tried: list[str] = []
        while True:
            url = self._pick(model, inputs, tried)
            tried.append(url)
            try:
                return await self.clients[url].infer(model, inputs)
            except APIError as exc:
                if not _unavailable(exc):
                    raise
                self._failed(url)
                if len(tried) > 1:
                    raise
            finally:
                self._done(url)

    async def stream(
        self, model: str, inputs: dict[str, np.ndarray], outputs: Iterable[str] | None = None
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        wanted = None if outputs is None else tuple(outputs)
        tried: list[str] = []
        sent = Progress()
        failure: APIError | None = None
        while True:
            feed = sent.resumed(inputs) if sent.responses else inputs
            try:
                url = self._pick(model, feed, tried)
            except APIError:
                raise failure or _no_replica() from None  # after a failure: that failure
            if sent.responses:
                self.metrics.resumed.labels(url).inc()
            tried.append(url)
            before = sent.responses
            try:
                upstream = self.clients[url].stream(model, feed, wanted)
                async with contextlib.aclosing(upstream) as responses:
                    async for response in responses:
                        yield sent.add(response)
                return
            except APIError as exc:
                if not _unavailable(exc):
                    raise
                self._failed(url)
                if sent.responses == before and len(tried) > 1:
                    raise  # a retry that got no further: give up
                why = cannot_resume(model, inputs, wanted) if sent.responses else ""
                if why:
                    raise lost(exc, why) from None
                failure = exc
            finally:
                self._done(url)
