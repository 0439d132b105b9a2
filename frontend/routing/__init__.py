"""Routing across several Triton replicas: `open_triton` picks a single client or a `Router`."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry

from frontend.engine_client.triton import TritonClient
from frontend.routing.router import DNS_PREFIX, Router, parse_urls


def is_multi(url: str) -> bool:
    return "," in url or url.strip().startswith(DNS_PREFIX)


def open_triton(
    url: str, server_id: str | None = None, registry: CollectorRegistry = REGISTRY
) -> TritonClient | Router:
    """One gRPC client for `host:port`; a started `Router` for `host:port,host:port` or
    `dns+name:port` (`server_id` then a comma list, one per url; metrics in `registry`). Call
    inside the event loop."""
    if not is_multi(url):
        return TritonClient(url, server_id=server_id)
    ids = server_id.split(",") if server_id else ()
    router = Router(parse_urls(url), server_ids=ids, registry=registry)
    router.start()
    return router
