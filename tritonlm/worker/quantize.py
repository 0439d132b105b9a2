"""`quantization: int8 | int4`: a checkpoint's decoder-layer projections quantized once at load.

Every projection `layer_names` finds (`layers.N.self_attn.q_proj`, … `mlp.down_proj`) that is a plain
nn.Linear becomes a `fused.QuantizedLinear` holding its weight quantized (`Int8Weight`: per output
channel; `Int4Weight`: groups of `INT4_GROUP` inputs), its dense weight dropped; `fused.fuse` then
groups them (q/k/v, gate/up) and `fused.hold_quantized` gives the others their projections, by the
int8 or int4 linear method. The embeddings and the LM head stay dense: the head's error reaches every
logit directly, and it is often tied to the embeddings. A projection the method's kernel cannot take
(its shape) stays dense, with a warning naming it.

The kernels are torch's CPU ones: other platforms, and a GGUF checkpoint (its own quantized types are
served as they are), are refused at start. Quality against the unquantized model: docs/features.md
("Quantized weights"), measured by client/quality.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from tritonlm import gguf_checkpoint
from tritonlm.layer_names import layer_module
from tritonlm.settings import ConfigError
from tritonlm.worker import linear
from tritonlm.worker.fused import QuantizedLinear
from tritonlm.worker.linear import Int4Weight, Int8Weight
from tritonlm.worker.linear.int4 import GROUP_SIZES

log = logging.getLogger(__name__)

# Inputs per int4 group: 32, not 128 (3/32 of a byte more per value): the mean next-token KL against
# float32 falls from 5.5 to 4.0 on the tiny random model, from 0.39 to 0.0011 on SmolLM2
# (docs/features.md, "Quantized weights").
INT4_GROUP = 32


def check(quantization: str, model_dir: str | Path, platform: str) -> None:
    """Refuses a `quantization` that cannot be served here, naming the setting."""
    if quantization == "none":
        return
    if platform != "cpu":
        raise ConfigError(
            f"quantization: {quantization} runs on torch's CPU kernels only, not on {platform}: "
            "set quantization=none or device=cpu"
        )
    file = gguf_checkpoint.weights_file(model_dir)
    if file is not None:
        raise ConfigError(
            f"quantization: {quantization} is for a checkpoint directory's dense weights; {file.name} "
            "is a GGUF file whose own quantized types are served as they are: set quantization=none"
        )


def quantize(model: nn.Module, quantization: str, group: int = INT4_GROUP) -> int:
    """Replaces the decoder layers' nn.Linear projections of `model` by their quantized forms (see
    above); returns how many. `quantization` none leaves the model as it is."""
    if quantization == "none":
        return 0
    replaced = 0
    for name, module in list(model.named_modules()):
        match = layer_module(name)
        if match is None or match.projection is None or type(module) is not nn.Linear:
            continue
        weight = _quantized(module.weight, quantization, group)
        why = linear.METHODS[quantization].supports(weight) if weight is not None else "its input groups"
        if why is not None:
            log.warning("%s: kept dense, the %s kernel cannot take it (%s)", name, quantization, why)
            continue
        bias = None if module.bias is None else module.bias.detach()
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, QuantizedLinear(weight, bias))
        replaced += 1
    log.info("quantization: %s: %d projections quantized", quantization, replaced)
    return replaced


def _quantized(weight: torch.Tensor, quantization: str, group: int) -> Int4Weight | Int8Weight | None:
    """`weight` quantized; None for int4 when no group size the kernel takes divides its inputs."""
    if quantization == "int8":
        return Int8Weight.quantize(weight)
    if quantization != "int4":
        raise ValueError(f"quantization: {quantization!r} is not int8 or int4")
    in_features = weight.shape[1]
    if in_features % group:  # the largest group size the kernel takes that fits
        group = max((g for g in GROUP_SIZES if g <= group and in_features % g == 0), default=0)
        if not group:
            return None
    return Int4Weight.quantize(weight, group)
