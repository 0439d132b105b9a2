"""Which of transformers' experts implementations runs a mixture-of-experts model
(`moe_implementation`), handed to `from_pretrained` at load.

transformers' MoE families (Qwen3-MoE, Mixtral, gpt-oss, …) hold their experts as 3D weights and
dispatch the experts' forward by name (`transformers.integrations.moe`): `grouped_mm` sorts the
token-expert pairs by expert and runs each projection as one grouped matmul (torch's
`grouped_mm`, which has a CPU kernel in torch >= 2.9); `eager` loops over the experts hit;
`batched_mm` gathers every pair's expert weights. On CPU `grouped_mm` is the fastest in float32
and bfloat16 at every batch measured (docs/benchmarks.md), so `auto` names it."""

from __future__ import annotations

from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoModelForCausalLM, PretrainedConfig

BEST = "grouped_mm"  # auto's choice on every platform measured (CPU float32 and bfloat16)


def experts_implementation(name: str, model_class: type, checkpoint: PretrainedConfig) -> str | None:
    """The `experts_implementation` to load `model_class` with: None (transformers' own, which a
    model without switchable experts ignores) where the model's experts cannot switch."""
    if model_class is AutoModelForCausalLM:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(checkpoint), model_class)
    # transformers' own test: the model's module decorates its experts with the interface.
    can_switch = getattr(model_class, "_can_set_experts_implementation", None)
    if can_switch is None or not can_switch():
        return None
    return BEST if name == "auto" else name
