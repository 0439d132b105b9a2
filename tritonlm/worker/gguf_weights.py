"""The engine's model from a GGUF file, its 4-bit, Q8_0 and Q6_K projections kept quantized.

The model is built without weights (accelerate's `init_empty_weights`) from the written directory's
config; each tensor of the file then goes where transformers' own GGUF loader would put it (its name
map and its per-architecture tensor processor: Llama's q/k rows permuted back, Gemma's norms):

- a projection (an `nn.Linear`'s weight) of a 4-bit type (Q4_0, Q4_1, Q4_K) becomes a
  `fused.QuantizedLinear` holding an `Int4Weight`, exactly the file's values, which `worker/fused.py`
  groups and hands to the `int4` linear method;
- a projection of type Q8_0 or Q6_K becomes a `QuantizedLinear` holding the file's blocks
  (`linear/gguf.py`), for the `gguf` linear method, where its kernels run (built, AVX-512, float32 or
  bfloat16);
- everything else (norms, embeddings, biases, and the types without a kernel here: Q5_0, Q5_1,
  Q5_K, …) is dequantized to the model's dtype, and the start-up log counts them by type.

Quantized weights stay on the CPU platform only; elsewhere every tensor is dequantized.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGUFReader, get_tensor_name_map
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS,
    Gemma2TensorProcessor,
    LlamaTensorProcessor,
    TensorProcessor,
    read_field,
)

from tritonlm.settings import ConfigError
from tritonlm.worker import gguf_blocks as blocks
from tritonlm.worker.fused import QuantizedLinear
from tritonlm.worker.linear import Weight
from tritonlm.worker.linear import gguf as gguf_method

log = logging.getLogger(__name__)

# Processors that change a tensor's values only by reordering a projection's rows or by shifting
# norms: a 4-bit projection can be kept as it is, its rows put back in order.
ROW_PROCESSORS = (TensorProcessor, LlamaTensorProcessor, Gemma2TensorProcessor)


def load(
    file: Path, config: PretrainedConfig, dtype: torch.dtype, keep_quantized: bool, **kwargs
) -> nn.Module:
    """The causal LM of `config` with the weights of GGUF `file`, its 4-bit, Q8_0 and Q6_K
    projections kept quantized if `keep_quantized` (on the CPU). `kwargs` go to the model's
    constructor."""
    from accelerate import init_empty_weights

    reader = GGUFReader(file)
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    if type(processor) not in ROW_PROCESSORS:
        raise ConfigError(
            f"model_dir: {file.name}: GGUF files of architecture {architecture!r} are not served "
            f"directly (their tensors are split or reshaped on loading); convert the file to a "
            f"checkpoint directory with transformers"
        )
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    names = _names(model, architecture)
    dense: dict[str, torch.Tensor] = {}
    quantized: dict[str, Weight] = {}
    kept, dequantized = Counter(), Counter()
    kinds = _kept_types(dtype) if keep_quantized else ()
    for tensor in reader.tensors:
        name = names.get(tensor.name)
        if name is None:
            where = type(model).__name__
            raise ConfigError(f"model_dir: {file.name}: tensor {tensor.name} has no place in {where}")
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the inner axis first
        kind = tensor.tensor_type
        if kind in kinds and _is_projection(model, name):
            if kind in blocks.INT4_TYPES:
                weight = blocks.int4_weight(tensor.data, kind, dtype)
            else:
                weight = blocks.blocks_weight(tensor.data, kind, shape[1], dtype)
            order = _rows(processor, tensor.name, shape[0])
            quantized[name] = weight if order is None else weight.rows(order)
            kept[kind.name] += 1
        else:
            values = blocks.dense(tensor.data, kind, shape, torch.float32).numpy()
            values = processor.process(weights=values, name=tensor.name).weights
            dense[name] = torch.from_numpy(np.ascontiguousarray(values)).to(dtype)
            if kind not in blocks.DENSE_TYPES:
                dequantized[kind.name] += 1
    model.load_state_dict(dense, strict=False, assign=True)
    for name, weight in quantized.items():
        _replace(model, name.removesuffix(".weight"), weight)
    model.tie_weights()
    _check_loaded(model, file)
    log.info(
        "%s: kept quantized: %s; dequantized to %s: %s",
        file.name,
        _count(kept) or "none",
        dtype,
        _count(dequantized) or "none",
    )
    return model


def _kept_types(dtype: torch.dtype) -> tuple:
    """The types kept quantized on the CPU: the 4-bit ones always (torch's kernel), Q8_0 and Q6_K
    where our kernels run for `dtype` (else they are dequantized, as the log then says)."""
    if gguf_method.unavailable(dtype) is None:
        return (*blocks.INT4_TYPES, *blocks.BLOCK_TYPES)
    return blocks.INT4_TYPES


def _names(model: nn.Module, architecture: str) -> dict[str, str]:
    """GGUF tensor name → the model's parameter name (gguf's own name table for the file's
    architecture, e.g. `blk.3.attn_q.weight` → `model.layers.3.self_attn.q_proj.weight`)."""
    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ConfigError(f"GGUF architecture {architecture!r} is unknown to the gguf package")
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for name in model.state_dict():
        base, dot, suffix = name.rpartition(".")
        found = table.get_name(base)
        if found is not None:
            names[f"{found}{dot}{suffix}"] = name
    return names


def _is_projection(model: nn.Module, name: str) -> bool:
    module_name, _, leaf = name.rpartition(".")
    return leaf == "weight" and type(model.get_submodule(module_name)) is nn.Linear


def _rows(processor: TensorProcessor, name: str, rows: int) -> torch.Tensor | None:
    """The order the processor puts a projection's rows in (it permutes Llama's q and k), found by
    processing the row numbers themselves; None if it keeps them."""
    order = processor.process(weights=np.arange(rows, dtype=np.float64)[:, None], name=name).weights
    order = np.asarray(order).reshape(-1).astype(np.int64)
    if (order == np.arange(rows)).all():
        return None
    if sorted(order.tolist()) != list(range(rows)):
        raise ConfigError(f"GGUF tensor {name}: its rows are not only reordered on loading")
    return torch.from_numpy(order)


def _replace(model: nn.Module, module_name: str, weight: Weight) -> None:
    parent, _, attribute = module_name.rpartition(".")
    linear = model.get_submodule(module_name)
    bias = None if linear.bias is None or linear.bias.is_meta else linear.bias
    setattr(model.get_submodule(parent), attribute, QuantizedLinear(weight, bias))


def _check_loaded(model: nn.Module, file: Path) -> None:
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ConfigError(f"model_dir: {file.name} has no tensor for {shown}")


def _count(kinds: Counter) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
