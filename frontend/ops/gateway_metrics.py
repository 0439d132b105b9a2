"""The series an inference gateway reads from a model server, on the frontend's `/metrics`: vLLM's
names and meanings, which Kubernetes' Gateway API Inference Extension (its endpoint picker, llm-d's
router) scrapes on the API's own port to pick a pod by load, KV cache and LoRA adapter.

Each scrape reads the engines' own gauges on every Triton replica's metrics port
(tritonlm.serving.engine_gauges; the address: FrontendConfig.triton_metrics_url) and gives, per
served model (`model_name`: the name clients send in `model`), over the replicas together:

- `vllm:num_requests_running`: sequences in the engines' running batches;
- `vllm:num_requests_waiting`: sequences queued for a place in a batch;
- `vllm:kv_cache_usage_perc`: the fraction (0-1) of KV-cache blocks held by sequences (blocks kept
  only for the prefix cache are free);
- `vllm:cache_config_info{block_size,num_gpu_blocks,enable_prefix_caching}`: 1; the blocks summed;
- `vllm:lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}`: the scrape's
  Unix time (the picker takes the newest), the adapters comma-joined by the names clients send.

A replica that does not answer within FETCH_TIMEOUT_S, or answers something else, adds nothing; with
none, the series are absent and the rest of /metrics is served as always.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from frontend.config import FrontendConfig
from tritonlm.contract import ENGINE
from tritonlm.lora.format import task_adapter_name
from tritonlm.serving.engine_gauges import EngineGauges, read_engine_gauges

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 1.0  # a gateway scrapes often; a replica slower than this is left out
MODEL_NAME = "model_name"


@dataclass(frozen=True)
class Sources:
    """Where the engines' gauges are and what to call them."""

    metrics_urls: tuple[str, ...]  # each Triton replica's metrics URL
    models: dict[str, str]  # an engine's Triton model name -> its served model's name
    adapters: dict[str, str]  # an engine's name for a LoRA adapter ("task <id>") -> clients' name


def sources(state: Any, config: FrontendConfig) -> Sources:
    """The app's Sources now: the Triton replicas its client reaches (none before start-up, or with
    a test's fake), its served models and its run-time adapters."""
    triton = getattr(state, "triton", None)
    urls = triton.urls() if hasattr(triton, "urls") else []
    models = {m.models.triton_name(ENGINE): name for name, m in state.served_models.items()}
    adapters = getattr(state, "runtime_adapters", {})
    return Sources(
        tuple(config.triton_metrics_url(url) for url in urls),
        models,
        {task_adapter_name(adapter.task_id): name for name, adapter in adapters.items()},
    )


class GatewayMetrics(Collector):
    """Registered in the frontend's registry; `refresh` (awaited before each scrape) reads the
    replicas, `collect` gives what the last refresh found."""

    def __init__(self, sources: Callable[[], Sources], registry: CollectorRegistry) -> None:
        self.sources = sources
        self.families: list[Metric] = []
        registry.register(self)

    async def refresh(self) -> None:
        try:
            await self._refresh()
        except Exception:  # a scrape must never fail: the frontend's own series still go out
            log.exception("reading the engines' gauges")
            self.families = []

    async def _refresh(self) -> None:
        sources = self.sources()
        # Plain HTTP to the replicas themselves: no proxy from the environment, no TLS context (whose
        # certificate loading would cost 20 ms a scrape).
        async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, verify=False, trust_env=False) as client:
            texts = await asyncio.gather(*(_fetch(client, url) for url in sources.metrics_urls))
        replicas = [engines for engines in map(_read, texts) if engines is not None]
        self.families = families(replicas, sources, time.time())

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


async def _fetch(client: httpx.AsyncClient, url: str) -> str | None:
    try:
        response = await client.get(url)
        response.raise_for_status()
        return response.text
    except httpx.HTTPError as error:
        log.debug("engine gauges from %s: %s", url, error)
        return None


def _read(text: str | None) -> dict[str, EngineGauges] | None:
    if text is None:
        return None
    try:
        return read_engine_gauges(text)
    except ValueError as error:  # not Prometheus' text: something else answers on that port
        log.debug("engine gauges unreadable: %s", error)
        return None


def families(replicas: Iterable[dict[str, EngineGauges]], sources: Sources, now: float) -> list[Metric]:
    """The vLLM-named families from each replica's engines (Triton model name -> gauges)."""
    replicas = list(replicas)
    running = GaugeMetricFamily(
        "vllm:num_requests_running", "sequences in the engine's running batch", labels=[MODEL_NAME]
    )
    waiting = GaugeMetricFamily(
        "vllm:num_requests_waiting", "sequences waiting for a place in the batch", labels=[MODEL_NAME]
    )
    usage = GaugeMetricFamily(
        "vllm:kv_cache_usage_perc", "fraction of KV-cache blocks in use (1: all)", labels=[MODEL_NAME]
    )
    cache = GaugeMetricFamily(
        "vllm:cache_config_info",
        "the KV cache's settings (value 1)",
        labels=[MODEL_NAME, "block_size", "num_gpu_blocks", "enable_prefix_caching"],
    )
    lora = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "LoRA adapters running and waiting (value: when this was read, Unix seconds)",
        labels=[MODEL_NAME, "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
    )
    for engine, name in sources.models.items():
        found = [engines[engine] for engines in replicas if engine in engines]
        if not found:
            continue  # no replica answered for it (down, or the model not loaded)

        def total(stat: str, found: list[EngineGauges] = found) -> float:
            return sum(gauges.stats.get(stat, 0.0) for gauges in found)

        running.add_metric([name], total("running"))
        waiting.add_metric([name], total("waiting"))
        blocks = total("kv_blocks_total")
        usage.add_metric([name], total("kv_blocks_used") / blocks if blocks else 0.0)
        first = found[0].stats
        if "block_size" in first:
            caching = "True" if first.get("prefix_caching") else "False"
            cache.add_metric([name, _integer(first["block_size"]), _integer(blocks), caching], 1.0)
        if "max_lora" in first:
            max_lora = min(gauges.stats.get("max_lora", 0.0) for gauges in found)
            running_adapters, waiting_adapters = (
                _adapter_list(found, state, sources.adapters) for state in ("running", "waiting")
            )
            lora.add_metric([name, _integer(max_lora), running_adapters, waiting_adapters], now)
    return [running, waiting, usage, cache, lora]


def _adapter_list(found: list[EngineGauges], state: str, names: dict[str, str]) -> str:
    """The adapters with sequences in `state` on any replica, by the names clients send, comma-joined."""
    adapters = {names.get(adapter, adapter) for gauges in found for adapter in gauges.adapters[state]}
    return ",".join(sorted(adapters))


def _integer(value: float) -> str:
    return str(int(value))
