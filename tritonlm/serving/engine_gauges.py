"""The engine's gauges as Triton's metrics port shows them: their names and labels (serving.metrics
publishes them) and the one reader of that text (the frontend's vLLM-named series, the bench and the
tests read it through here).

Every series carries `model`, the engine's Triton model name (`engine`, `smollm2__engine`, …): several
engines in one tritonserver (MODEL_DIRS) each have their own, where Triton would otherwise give them
one shared gauge per label set.

No Triton, no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

ENGINE_FAMILY = "tritonlm_engine"  # {model, stat}: Engine.stats()'s values, and max_lora
ADAPTER_FAMILY = "tritonlm_engine_lora_sequences"  # {model, adapter, state}: sequences per LoRA adapter
MODEL = "model"
STAT = "stat"
ADAPTER = "adapter"
STATE = "state"  # "running" or "waiting"
STATES = ("running", "waiting")


@dataclass
class EngineGauges:
    """One engine's gauges: `stats` by name, `adapters[state][adapter name]` its sequences (> 0)."""

    stats: dict[str, float] = field(default_factory=dict)
    adapters: dict[str, dict[str, float]] = field(default_factory=lambda: {s: {} for s in STATES})


def read_engine_gauges(text: str) -> dict[str, EngineGauges]:
    """Triton model name -> its engine's gauges, from Triton's metrics text. ValueError when the
    text is not Prometheus' format."""
    engines: dict[str, EngineGauges] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (ENGINE_FAMILY, ADAPTER_FAMILY):
            continue
        for sample in family.samples:
            labels = sample.labels
            if MODEL not in labels:
                continue
            engine = engines.setdefault(labels[MODEL], EngineGauges())
            if family.name == ENGINE_FAMILY and STAT in labels:
                engine.stats[labels[STAT]] = sample.value
            elif labels.get(STATE) in STATES and ADAPTER in labels and sample.value > 0:
                engine.adapters[labels[STATE]][labels[ADAPTER]] = sample.value
    return engines
