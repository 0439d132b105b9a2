"""Linear methods: how each projection's weights are stored and multiplied (`base.LinearMethod`).

`METHODS` names them, best first; `choose(name, weight)` gives the first that holds a projection's
weight. A new method (a quantized format, a GPU kernel) is one module and one line here.
"""

from __future__ import annotations

import torch

from tritonlm.worker.linear.base import LinearMethod, Projection
from tritonlm.worker.linear.dense import DenseTorch
from tritonlm.worker.linear.onednn import OneDnnPacked

# name -> method, best first (`torch` holds any weight, so it comes last).
METHODS: dict[str, type[LinearMethod]] = {m.name: m for m in (OneDnnPacked, DenseTorch)}

__all__ = ["METHODS", "LinearMethod", "Projection", "choose", "prepare"]


def choose(name: str, weight: torch.Tensor) -> type[LinearMethod]:
    """The method for the projection `name` (e.g. `model.layers.3.self_attn.qkv`): the best that
    holds `weight`. The name is there for per-layer rules (a quantization that skips the LM head)."""
    return next(method for method in METHODS.values() if method.supports(weight) is None)


def prepare(name: str, weight: torch.Tensor, bias: torch.Tensor | None) -> Projection:
    """The projection `name` of `weight` and `bias`, by the method `choose` picks."""
    return choose(name, weight).prepare(weight, bias)
