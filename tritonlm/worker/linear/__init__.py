"""Linear methods: how each projection's weights are stored and multiplied (`base.LinearMethod`).

`METHODS` names them, best first; `choose(name, weight)` gives the first that holds a projection's
weight. A new method (a quantized format, a GPU kernel) is one module and one line here.

A weight is a dense tensor or a quantized form (`int4.Int4Weight`: GGUF's 4-bit types and
`quantization: int4`; `int8.Int8Weight`: `quantization: int8`; `gguf.Q8_0Weight`, `gguf.Q6_KWeight`:
GGUF's Q8_0 and Q6_K blocks as the file has them). A quantized
weight that no method holds here (a shape its kernel does not take, another device) is dequantized
to a dense one, with a warning naming the projection: slower and larger, never wrong.
"""

from __future__ import annotations

import logging

import torch

from tritonlm.worker.linear.base import LinearMethod, Projection, QuantizedWeight
from tritonlm.worker.linear.dense import DenseTorch
from tritonlm.worker.linear.gemv import GemvDense
from tritonlm.worker.linear.gguf import GgufBlocks
from tritonlm.worker.linear.int4 import Int4Packed, Int4Weight
from tritonlm.worker.linear.int8 import Int8Packed, Int8Weight
from tritonlm.worker.linear.onednn import OneDnnPacked

log = logging.getLogger(__name__)

# name -> method, best first (`torch` holds any dense weight, so it comes last).
METHODS: dict[str, type[LinearMethod]] = {
    m.name: m for m in (Int4Packed, Int8Packed, GgufBlocks, GemvDense, OneDnnPacked, DenseTorch)
}

Weight = torch.Tensor | QuantizedWeight

__all__ = [
    "METHODS",
    "Int4Weight",
    "Int8Weight",
    "LinearMethod",
    "Projection",
    "QuantizedWeight",
    "Weight",
    "choose",
    "prepare",
]


def choose(name: str, weight: Weight) -> type[LinearMethod] | None:
    """The method for the projection `name` (e.g. `model.layers.3.self_attn.qkv`): the best that
    holds `weight`, or None for a quantized weight none holds. The name is there for per-layer rules
    (a quantization that skips the LM head)."""
    fits = (m for m in METHODS.values() if isinstance(weight, m.holds) and m.supports(weight) is None)
    return next(fits, None)


def prepare(name: str, weight: Weight, bias: torch.Tensor | None) -> Projection:
    """The projection `name` of `weight` and `bias`, by the method `choose` picks."""
    method = choose(name, weight)
    if method is None:
        holders = [m for m in METHODS.values() if isinstance(weight, m.holds)]
        why = "; ".join(f"{m.name}: {m.supports(weight)}" for m in holders)
        log.warning("%s: %s weight dequantized (%s)", name, type(weight).__name__, why)
        weight = weight.dequantize()
        method = choose(name, weight)
    return method.prepare(weight, bias)
