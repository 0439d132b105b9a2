"""TensorRT-LLM's LoRA tensors, and PEFT adapter directories turned into them.

`lora_config` has one row `[module_id, layer_idx, adapter_size]` per adapted projection of a layer;
the same row of `lora_weights` holds `flatten(A[r, in])` then `flatten(B[out, r] · scale)`, zero-padded
to the longest row. Module ids are TensorRT-LLM's (`LoraManager.LORA_MODULE_IDS`), and Hugging Face
projection names map to them as TensorRT-LLM's own converter (`examples/hf_lora_convert.py`) maps
them: note up_proj → mlp_gate and gate_proj → mlp_h_to_4h.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from tritonlm.layer_names import layer_module

MODULE_IDS: dict[str, int] = {
    "attn_qkv": 0,
    "attn_q": 1,
    "attn_k": 2,
    "attn_v": 3,
    "attn_dense": 4,
    "mlp_h_to_4h": 5,
    "mlp_4h_to_h": 6,
    "mlp_gate": 7,
}
MODULE_NAMES = {v: k for k, v in MODULE_IDS.items()}
# Hugging Face (Llama-family) projection -> TensorRT-LLM module, as hf_lora_convert.py maps them.
HF_TO_MODULE: dict[str, str] = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "down_proj": "mlp_4h_to_h",
    "up_proj": "mlp_gate",
}
MODULE_TO_HF = {v: k for k, v in HF_TO_MODULE.items()}
# attn_qkv (a fused projection in TensorRT-LLM) adapts q, k and v: B's rows are q's, then k's, then v's.
QKV = ("q_proj", "k_proj", "v_proj")

_PEFT_WEIGHTS = {"A.weight": "A", "B.weight": "B"}  # what follows `.lora_` in a PEFT weight's key


class AdapterFormatError(ValueError):
    """A PEFT directory this engine cannot serve; the message says what and why."""


def peft_to_tensors(adapter_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A PEFT LoRA directory (adapter_config.json + adapter_model.safetensors/.bin) as
    (`lora_weights` [rows, D] float32, `lora_config` [rows, 3] int32)."""
    from peft import LoraConfig
    from peft.utils import load_peft_weights

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():  # else PEFT would ask the model hub
        raise AdapterFormatError(f"{adapter_dir}: no adapter_config.json (not a PEFT adapter directory)")
    try:
        config = LoraConfig.from_pretrained(str(adapter_dir))
        state = load_peft_weights(str(adapter_dir), device="cpu")
    except (OSError, ValueError, TypeError) as error:
        raise AdapterFormatError(f"{adapter_dir}: not a PEFT LoRA adapter directory ({error})") from None
    unsupported = {
        "use_dora": bool(getattr(config, "use_dora", False)),
        "bias": getattr(config, "bias", "none") != "none",
        "modules_to_save": bool(getattr(config, "modules_to_save", None)),
        "fan_in_fan_out": bool(getattr(config, "fan_in_fan_out", False)),
        "alpha_pattern": bool(getattr(config, "alpha_pattern", None)),
    }
    if any(unsupported.values()):
        names = ", ".join(k for k, v in unsupported.items() if v)
        raise AdapterFormatError(f"{adapter_dir}: {names} not supported (plain LoRA on projections only)")
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in state.items():
        name, _, weight = key.rpartition(".lora_")  # e.g. base_model.model.model.layers.0.self_attn.q_proj
        match = layer_module(name)
        if not match or match.projection not in HF_TO_MODULE or weight not in _PEFT_WEIGHTS:
            raise AdapterFormatError(
                f"{adapter_dir}: weight {key!r} is not a LoRA A/B of a projection this engine adapts "
                f"({', '.join(HF_TO_MODULE)})"
            )
        pairs.setdefault((match.layer, match.projection), {})[_PEFT_WEIGHTS[weight]] = value.float().numpy()
    rows, entries = [], []
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterFormatError(f"{adapter_dir}: layer {layer} {module} lacks lora_A or lora_B")
        a, b = ab["A"], ab["B"]  # PEFT: A [r, in], B [out, r]
        rank = a.shape[0]
        scale = config.lora_alpha / (math.sqrt(rank) if config.use_rslora else rank)
        rows.append(np.concatenate([a.reshape(-1), (b * scale).reshape(-1)]))
        entries.append([MODULE_IDS[HF_TO_MODULE[module]], layer, rank])
    if not rows:
        raise AdapterFormatError(f"{adapter_dir}: the adapter has no LoRA weights")
    width = max(r.size for r in rows)
    weights = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        weights[i, : row.size] = row
    return weights, np.array(entries, dtype=np.int32)


def task_adapter_name(task_id: int) -> str:
    """The name an adapter sent by `lora_task_id` goes by in messages and the engine's metrics."""
    return f"task {task_id}"


def parse_lora_modules(text: str) -> dict[str, str]:
    """vLLM's `name=/path/to/adapter,…` as {name: path}; raises ValueError naming the bad entry."""
    modules: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, path = entry.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ValueError(f"entry {entry!r} is not name=/path/to/adapter")
        check_adapter_name(name)
        if name in modules:
            raise ValueError(f"adapter name {name!r} is given twice")
        modules[name] = path
    return modules


def check_adapter_name(name: str) -> None:
    """An adapter's name is a model name in the HTTP APIs; "None" is TGI's word for the base model."""
    if not re.fullmatch(r"[A-Za-z0-9._/-]{1,256}", name) or name == "None":
        raise ValueError(f"adapter name {name!r}: use 1-256 characters from A-Z a-z 0-9 . _ / -")
