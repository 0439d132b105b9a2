"""The engine's statistics as Triton custom metrics (served on Triton's metrics port). Imported only
inside Triton's Python backend."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from tritonlm.engine.loop import Engine


class EngineMetrics:
    """Engine statistics as Triton custom metrics (served on Triton's metrics port):

    - gauges `tritonlm_engine{stat=...}`: running, waiting, kv_blocks_used/free/total,
      prefix_cache_hit_rate (cached / looked-up prompt tokens since start-up), and the since-start-up
      totals steps, max_batch_size_seen, tokens_generated, preemptions, prefix_cache_queries/hits,
      and speculative decoding's spec_proposed_tokens, spec_accepted_tokens, spec_acceptance_rate
      (proposals verified, kept, and their ratio; draft tokens from clients count too);
    - counters `tritonlm_preemptions_total`, `tritonlm_generated_tokens_total`;
    - histograms `tritonlm_time_to_first_token_seconds` (arrival to first token, per request) and
      `tritonlm_time_per_output_token_seconds` (mean gap between a request's later tokens).
    """

    TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
    TPOT_BUCKETS = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5]

    def __init__(self) -> None:
        # Families must outlive their metrics, so they are kept on the object.
        family = pb_utils.MetricFamily
        self.gauge_family = family("tritonlm_engine", "in-flight batching engine state", family.GAUGE)
        self.gauges: dict[str, object] = {}
        self.last: dict[str, float] = {}
        self.counter_families = {
            "preemptions": family(
                "tritonlm_preemptions_total", "running requests paused for lack of KV blocks", family.COUNTER
            ),
            "tokens_generated": family("tritonlm_generated_tokens_total", "tokens generated", family.COUNTER),
        }
        self.counters = {name: f.Metric(labels={}) for name, f in self.counter_families.items()}
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
            "ttft": self.histogram_families["ttft"].Metric(labels={}, buckets=self.TTFT_BUCKETS),
            "tpot": self.histogram_families["tpot"].Metric(labels={}, buckets=self.TPOT_BUCKETS),
        }

    def update(self, engine: Engine) -> None:
        stats = engine.stats()
        for name, value in stats.items():
            if self.last.get(name) == value:
                continue  # each update is a message to the server: send changes only
            if name not in self.gauges:
                self.gauges[name] = self.gauge_family.Metric(labels={"stat": name})
            self.gauges[name].set(value)
            if name in self.counters:
                self.counters[name].increment(value - self.last.get(name, 0))
            self.last[name] = value
        latencies = engine.counters.latencies
        while latencies:
            kind, seconds = latencies.popleft()
            self.histograms[kind].observe(seconds)
