"""The engine's statistics as Triton custom metrics (served on Triton's metrics port). Imported only
inside Triton's Python backend."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from tritonlm.engine.loop import Engine
from tritonlm.serving.engine_gauges import ADAPTER, ADAPTER_FAMILY, ENGINE_FAMILY, MODEL, STAT, STATE


class EngineMetrics:
    """Engine statistics as Triton custom metrics (served on Triton's metrics port):

    - gauges `tritonlm_engine{model=...,stat=...}`: running, waiting, kv_blocks_used/free/total,
      block_size, prefix_caching (1 or 0), max_lora (LoRA adapters a batch can mix: the named ones
      and the task-id cache's), prefix_cache_hit_rate (cached / looked-up prompt tokens since
      start-up), and the since-start-up totals steps, max_batch_size_seen, tokens_generated,
      preemptions, prefix_cache_queries/hits, and speculative decoding's spec_proposed_tokens,
      spec_accepted_tokens, spec_acceptance_rate (proposals verified, kept, and their ratio; draft
      tokens from clients count too);
    - gauges `tritonlm_engine_lora_sequences{model,adapter,state}`: sequences running or waiting
      with each LoRA adapter (its name, or `task <id>`);
    - counters `tritonlm_preemptions_total`, `tritonlm_generated_tokens_total`;
    - histograms `tritonlm_time_to_first_token_seconds` (arrival to first token, per request) and
      `tritonlm_time_per_output_token_seconds` (mean gap between a request's later tokens).

    Every series is labelled `model` with the engine's Triton model name (engine_gauges).
    """

    TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
    TPOT_BUCKETS = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5]

    def __init__(self, model: str, max_lora: int) -> None:
        # Families must outlive their metrics, so they are kept on the object.
        family = pb_utils.MetricFamily
        self.model = model
        self.gauge_family = family(ENGINE_FAMILY, "in-flight batching engine state", family.GAUGE)
        self.gauges: dict[str, object] = {}
        self.last: dict[str, float] = {}
        self.adapter_family = family(
            ADAPTER_FAMILY, "sequences running or waiting with each LoRA adapter", family.GAUGE
        )
        # (state, adapter) -> its gauge and the count it shows, while sequences use the adapter
        self.adapter_gauges: dict[tuple[str, str], tuple[object, int]] = {}
        self.max_lora = max_lora
        self.counter_families = {
            "preemptions": family(
                "tritonlm_preemptions_total", "running requests paused for lack of KV blocks", family.COUNTER
            ),
            "tokens_generated": family("tritonlm_generated_tokens_total", "tokens generated", family.COUNTER),
        }
        labels = {MODEL: model}
        self.counters = {name: f.Metric(labels=labels) for name, f in self.counter_families.items()}
        self.histogram_families = {
            "ttft": family(
                "tritonlm_time_to_first_token_seconds", "request arrival to first token", family.HISTOGRAM
            ),
            "tpot": family(
                "tritonlm_time_per_output_token_seconds",
                "mean time between a request's tokens after the first",
                family.HISTOGRAM,
            ),
        }
        self.histograms = {
            "ttft": self.histogram_families["ttft"].Metric(labels=labels, buckets=self.TTFT_BUCKETS),
            "tpot": self.histogram_families["tpot"].Metric(labels=labels, buckets=self.TPOT_BUCKETS),
        }

    def update(self, engine: Engine) -> None:
        stats = {**engine.stats(), "max_lora": self.max_lora}
        for name, value in stats.items():
            if self.last.get(name) == value:
                continue  # each update is a message to the server: send changes only
            if name not in self.gauges:
                self.gauges[name] = self.gauge_family.Metric(labels={MODEL: self.model, STAT: name})
            self.gauges[name].set(value)
            if name in self.counters:
                self.counters[name].increment(value - self.last.get(name, 0))
            self.last[name] = value
        self._update_adapters(engine.adapter_sequences())
        latencies = engine.counters.latencies
        while latencies:
            kind, seconds = latencies.popleft()
            self.histograms[kind].observe(seconds)

    def _update_adapters(self, counts: dict[tuple[str, str], int]) -> None:
        """One gauge per (state, adapter) in use, sent when its count changes; one that falls to none
        is set to 0 and forgotten (Triton keeps its series, at 0; readers list adapters above 0)."""
        for key, count in counts.items():
            gauge, shown = self.adapter_gauges.get(key, (None, 0))
            if gauge is None:
                state, adapter = key
                labels = {MODEL: self.model, ADAPTER: adapter, STATE: state}
                gauge = self.adapter_family.Metric(labels=labels)
            if count != shown:
                gauge.set(count)
            self.adapter_gauges[key] = (gauge, count)
        for key in [k for k in self.adapter_gauges if k not in counts]:
            self.adapter_gauges.pop(key)[0].set(0)
