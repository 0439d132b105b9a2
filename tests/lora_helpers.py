"""Test LoRA adapters, built deterministically at test time with PEFT on the tiny model, and the
reference they must match: transformers `generate` of the adapter merged into the base."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(
    model_dir: Path, out_dir: Path, seed: int, rank: int = 8, targets: list[str] | None = None
) -> Path:
    """A PEFT LoRA directory with random A and B (PEFT starts B at zero, which changes nothing),
    large enough to change greedy outputs."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets or ALL_PROJECTIONS)
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    model.save_pretrained(out_dir)
    return out_dir


def merged_generate(
    model_dir: Path, adapter_dir: Path | None, prompt: list[int], new_tokens: int
) -> list[int]:
    """Greedy tokens of the base model (adapter None) or of the adapter merged into it."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
