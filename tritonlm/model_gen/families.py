"""Random checkpoints of the popular families at SmolLM2-135M's size, for `make bench`'s per-family
rows: each from its family's own transformers config class, in bfloat16, with SmolLM2's tokenizer
(the vocabulary matches), deterministic (a fixed seed), generated at bench time and never committed.

    python -m tritonlm.model_gen.families OUT_DIR --family qwen3 --tokenizer-dir models/smollm2-135m-instruct

Random weights make random tokens: the bench serves them with `ignore_eos`, for speed only.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

# SmolLM2-135M's shape: every family is served at the same size, so their rows compare.
SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
               tie_word_embeddings=True)  # fmt: skip
HEAD = dict(head_dim=64)  # families whose default head_dim is not hidden / heads
# Experts whose active width is the dense model's: 4 of 8, each a quarter of its MLP.
EXPERTS = dict(num_experts=8, num_experts_per_tok=4, moe_intermediate_size=384, decoder_sparse_step=1)

FAMILIES: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": lambda: LlamaConfig(**SMOLLM2),
    "qwen2": lambda: Qwen2Config(**SMOLLM2),
    "qwen3": lambda: Qwen3Config(**SMOLLM2, **HEAD),
    "mistral": lambda: MistralConfig(**SMOLLM2, sliding_window=None),
    "granite": lambda: GraniteConfig(
        **SMOLLM2,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=1 / 64,
        logits_scaling=8.0,
    ),  # fmt: skip
    "phi3": lambda: Phi3Config(**SMOLLM2, pad_token_id=0),
    "qwen3-moe": lambda: Qwen3MoeConfig(**SMOLLM2, **HEAD, **EXPERTS),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def generate(out_dir: str | Path, family: str, tokenizer_dir: Path, seed: int = 0) -> Path:
    """`family`'s random bf16 checkpoint in `out_dir` (kept when its config is already there), with
    the tokenizer of `tokenizer_dir` (SmolLM2's: `make bench` prepares it)."""
    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    if family not in FAMILIES:
        raise ValueError(f"family: {family!r} is not one of {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILIES[family](), dtype=torch.bfloat16)
    model.config.architectures = [type(model).__name__]
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, tmp / name)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--tokenizer-dir", type=Path, required=True, help="SmolLM2's directory")
    args = parser.parse_args(argv)
    print(generate(args.out_dir, args.family, args.tokenizer_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
