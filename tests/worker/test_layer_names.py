"""The one rule for where a decoder layer's projections live (fused blocks, LoRA hooks, PEFT keys)."""

from __future__ import annotations

from tritonlm.layer_names import LayerModule, layer_module


def test_blocks_and_their_projections_are_found_by_name():
    assert layer_module("model.layers.3.self_attn") == LayerModule(3, "self_attn", None)
    assert layer_module("model.layers.12.mlp.down_proj") == LayerModule(12, "mlp", "down_proj")
    assert layer_module("layers.0.self_attn.q_proj") == LayerModule(0, "self_attn", "q_proj")


def test_other_modules_are_not_layer_modules():
    for name in (
        "model.layers.3",
        "model.norm",
        "lm_head",
        "model.layers.3.self_attn.q_proj.lora_A",
        "mylayers.0.mlp",
    ):
        assert layer_module(name) is None
