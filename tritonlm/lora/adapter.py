"""TensorRT-LLM's LoRA tensors → a `LoraAdapter`: per adapted projection, A [r, in] and B·scale
[out, r] in the model's dtype on its device, checked against the model's projections."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

from tritonlm.errors import InvalidRequest
from tritonlm.lora.format import MODULE_NAMES, MODULE_TO_HF, QKV

_uids = itertools.count(1)

# (layer index, Hugging Face projection name) -> (in_features, out_features)
Shapes = dict[tuple[int, str], tuple[int, int]]


@dataclass(eq=False)
class LoraAdapter:
    name: str  # "task <id>" or the LORA_MODULES name, for messages
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # (layer, proj) -> (A, B·scale)
    nbytes: int
    # Unique per loaded adapter: the prefix cache keys a prompt's blocks by it (KV differs per adapter).
    uid: int = field(default_factory=lambda: next(_uids))
    users: int = 0  # requests holding it (store.LoraStore counts them; never evicted while > 0)


def build_adapter(
    name: str,
    weights: np.ndarray,
    config: np.ndarray,
    shapes: Shapes,
    dtype: torch.dtype,
    device: torch.device,
) -> LoraAdapter:
    """Checks `lora_weights` [rows, D] and `lora_config` [rows, 3] against the model's projection
    `shapes` and builds the adapter; errors name the tensor and the row."""
    if weights.ndim != 2 or config.ndim != 2 or config.shape[1] != 3:
        raise InvalidRequest(
            f"lora_weights/lora_config: expected [rows, D] and [rows, 3], got {list(weights.shape)} "
            f"and {list(config.shape)}"
        )
    if weights.shape[0] != config.shape[0] or not config.shape[0]:
        raise InvalidRequest(
            f"lora_config: {config.shape[0]} rows for {weights.shape[0]} rows of lora_weights "
            "(one row per adapted module of a layer, at least one)"
        )
    if not np.isfinite(weights).all():
        raise InvalidRequest("lora_weights: must be finite (no NaN or infinity)")
    layers = 1 + max(layer for layer, _ in shapes)
    out: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    nbytes = 0
    for i, (module_id, layer, rank) in enumerate(config.tolist()):
        where = f"lora_config row {i}"
        if module_id not in MODULE_NAMES:
            raise InvalidRequest(f"{where}: module id {module_id} is not one of {sorted(MODULE_NAMES)}")
        module = MODULE_NAMES[module_id]
        projections = QKV if module == "attn_qkv" else (MODULE_TO_HF[module],)
        if not 0 <= layer < layers:
            raise InvalidRequest(f"{where}: layer {layer} is not in [0, {layers})")
        if any((layer, p) not in shapes for p in projections):
            raise InvalidRequest(f"{where}: this model has no {module} projection in layer {layer}")
        fan_in = shapes[(layer, projections[0])][0]
        fan_out = sum(shapes[(layer, p)][1] for p in projections)
        if rank < 1 or rank * (fan_in + fan_out) > weights.shape[1]:
            raise InvalidRequest(
                f"{where}: adapter_size {rank} needs {max(rank, 1) * (fan_in + fan_out)} values of "
                f"lora_weights ({module}: {fan_in} in, {fan_out} out); the rows have {weights.shape[1]}"
            )
        row = torch.from_numpy(np.ascontiguousarray(weights[i], dtype=np.float32))
        a = row[: rank * fan_in].reshape(rank, fan_in).to(device=device, dtype=dtype)
        b = row[rank * fan_in : rank * (fan_in + fan_out)].reshape(fan_out, rank)
        b = b.to(device=device, dtype=dtype)
        nbytes += (a.numel() + b.numel()) * a.element_size()
        start = 0
        for p in projections:  # attn_qkv: B's rows are q's, then k's, then v's
            if (layer, p) in out:
                raise InvalidRequest(f"{where}: layer {layer} {p} is adapted twice")
            size = shapes[(layer, p)][1]
            out[(layer, p)] = (a, b[start : start + size])
            start += size
    return LoraAdapter(name, out, nbytes)
