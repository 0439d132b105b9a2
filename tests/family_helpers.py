"""Random small checkpoints of each decoder family the engine serves (their configs, and how their
weights are drawn), shared by the parity tests: in process (tests/worker/test_family_parity.py,
test_attention_features.py, test_recurrent_state.py) and through the real server
(tests/e2e/test_family_serving.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    GPTNeoXConfig,
    GptOssConfig,
    GraniteConfig,
    MistralConfig,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
)

# Families without an attention feature of their own (each a config maker).
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)  # fmt: skip
FAMILIES = {
    "qwen2": lambda: Qwen2Config(**SMALL),
    "qwen3": lambda: Qwen3Config(**SMALL, head_dim=16),
    "phi-3": lambda: Phi3Config(**SMALL, pad_token_id=0),
    "olmo 2": lambda: Olmo2Config(**SMALL),
    "granite": lambda: GraniteConfig(
        **SMALL,
        embedding_multiplier=4.0,
        residual_multiplier=0.5,
        attention_multiplier=0.25,
        logits_scaling=2.0,
    ),  # fmt: skip
    "gpt-neox": lambda: GPTNeoXConfig(**SMALL, rotary_pct=0.5),
    "gpt-2": lambda: GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=256),
    "qwen3-moe": lambda: Qwen3MoeConfig(
        **SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64
    ),  # fmt: skip
    "mixtral": lambda: MixtralConfig(**SMALL, num_local_experts=4),
}

# Families whose attention has a feature of its own (a window, soft-capping, sinks).
WINDOW = 8
WINDOWED_SMALL = dict(SMALL, head_dim=16, sliding_window=WINDOW)
LOCAL_GLOBAL = ["sliding_attention", "full_attention"]
WINDOWED_FAMILIES = {
    "mistral": MistralConfig(**WINDOWED_SMALL),
    # a cap the scores reach (the default 50 would be the identity on these weights)
    "gemma 2": Gemma2Config(**WINDOWED_SMALL, attn_logit_softcapping=2.0, layer_types=LOCAL_GLOBAL),
    "gemma 3": Gemma3TextConfig(**WINDOWED_SMALL, layer_types=LOCAL_GLOBAL),
    "gpt-oss": GptOssConfig(
        **WINDOWED_SMALL, num_local_experts=4, num_experts_per_tok=2, layer_types=LOCAL_GLOBAL
    ),
}

# A hybrid: layer 0 linear attention (its recurrent state beside the KV cache), layer 1 full attention.
QWEN3_NEXT = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=256, max_position_embeddings=256, full_attention_interval=2, num_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
)  # fmt: skip
HYBRID_FAMILIES = {"qwen3-next": lambda: Qwen3NextConfig(**QWEN3_NEXT)}
# Parameters a random checkpoint keeps as initialised: norms (GPT-2's `ln_*` too), and the state-space
# decay and step bias.
KEEP_INITIALISED = ("norm", "ln", "A_log", "dt_bias")
EMBEDDINGS = ("embed", "wte", "wpe")


def random_checkpoint(
    config: PretrainedConfig, path: Path, dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """`config`'s model with weights larger than transformers' initialisation, saved at `path`:
    logits far from ties (fp32 summation order cannot change a greedy token) and tokens that depend
    on attention (with the initialisation, Gemma's scaled embeddings dominate and Qwen3-Next repeats
    one token)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if not any(part in name for part in KEEP_INITIALISED):
                weight.normal_(0, 0.1 if any(part in name for part in EMBEDDINGS) else 0.3)
    model.to(dtype)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    return model
