"""`quantization: int8 | int4` (tritonlm/worker/quantize.py): the decoder layers' projections
quantized at load, held by their linear methods fused or not, under LoRA adapters, in the engine on
the decoder stack, refused where it cannot run; and the quality bounds (client/quality.py) on the
tiny model."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from engine_helpers import request, run_all
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from client import quality
from tritonlm.config import EngineConfig
from tritonlm.lora.layers import LoraLayers
from tritonlm.settings import ConfigError
from tritonlm.worker import cpu_kernels, fused, quantize
from tritonlm.worker.model_paths.decoder_stack import DecoderStack
from tritonlm.worker.model_runner import ModelRunner

KINDS = ["int8", "int4"]


def _load(model_dir, quantization: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    """The tiny model with `quantization` applied, and a dense copy holding the same (dequantized)
    weights: what the quantized model must compute."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    assert quantize.quantize(model, quantization) == 7 * model.config.num_hidden_layers
    dense = copy.deepcopy(model)
    for name, module in list(dense.named_modules()):
        if isinstance(module, fused.QuantizedLinear):
            linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            linear.weight.data = module.quantized.dequantize()
            parent, _, attribute = name.rpartition(".")
            setattr(dense.get_submodule(parent), attribute, linear)
    return model, dense


@pytest.mark.parametrize("quantization", KINDS)
def test_only_the_layers_projections_are_quantized(model_dir, quantization):
    model, _ = _load(model_dir, quantization)
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.q_proj, fused.QuantizedLinear) and not hasattr(attention.q_proj, "weight")
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == torch.float32
    assert type(model.model.embed_tokens) is nn.Embedding
    assert quantize.quantize(model, quantization) == 0  # nothing left to quantize
    assert quantize.quantize(AutoModelForCausalLM.from_pretrained(model_dir), "none") == 0


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("quantization", KINDS)
def test_the_quantized_model_computes_its_dequantized_weights(model_dir, quantization, fuse):
    model, dense = _load(model_dir, quantization)
    if fuse:
        assert fused.fuse(model)
        assert model.model.layers[1].mlp.gate_proj.group.projection.method == quantization
    assert fused.hold_quantized(model) == (0 if fuse else 7 * model.config.num_hidden_layers)
    assert model.model.layers[1].self_attn.o_proj.projection.method == quantization
    ids = torch.randint(5, 4000, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, dense(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("quantization", KINDS)
def test_lora_adds_to_quantized_weights_what_it_adds_to_dense_ones(model_dir, quantization):
    model, merged = _load(model_dir, quantization)
    fused.fuse(model)
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for layer, block, projection in (
        (0, "self_attn", "k_proj"),
        (1, "mlp", "down_proj"),
        (2, "mlp", "up_proj"),
    ):
        target = getattr(merged.get_submodule(f"model.layers.{layer}.{block}"), projection)
        a = torch.randn(4, target.in_features, generator=gen) * 0.1
        b = torch.randn(target.out_features, 4, generator=gen) * 0.1
        weights[(layer, projection)] = (a, b)
        target.weight.data += b @ a
    lora = LoraLayers(model)
    ids = torch.randint(5, 4000, (1, 12), generator=gen)
    with (
        torch.inference_mode(),
        lora.step([types.SimpleNamespace(weights=weights)], [12], torch.device("cpu")),
    ):
        got = model(ids).logits
    with torch.inference_mode():
        torch.testing.assert_close(got, merged(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason=f"{cpu_kernels.unavailable()}")
@pytest.mark.parametrize("quantization", KINDS)
def test_the_engine_serves_a_quantized_model_on_the_decoder_stack(model_dir, quantization):
    config = EngineConfig(str(model_dir), dtype="float32", quantization=quantization, max_num_seqs=4)
    runner = ModelRunner(config)
    assert isinstance(runner.fast_path, DecoderStack)
    assert runner.fast_path.head.method != quantization  # the LM head stays dense
    reference, _ = _load(model_dir, quantization)
    reference = quality.engine_model(reference)
    prompts = [list(range(10, 40)), [5, 6, 7, 8]]
    _, seqs = run_all(runner, [request(p, 6) for p in prompts])
    for prompt, seq in zip(prompts, seqs, strict=True):
        assert seq.output_ids == quality.greedy(reference, prompt, 6)


def test_quantization_is_refused_where_it_cannot_run(model_dir, tmp_path):
    quantize.check("none", model_dir, "cuda")
    with pytest.raises(ConfigError, match="quantization: int8 runs on torch's CPU kernels only"):
        quantize.check("int8", model_dir, "cuda")
    (tmp_path / "weights.gguf").write_bytes(b"")
    (tmp_path / "model.gguf").symlink_to(tmp_path / "weights.gguf")
    with pytest.raises(ConfigError, match="weights.gguf is a GGUF file"):
        quantize.check("int4", tmp_path, "cpu")
    with pytest.raises(ConfigError, match="quantization"):
        EngineConfig(str(model_dir), quantization="int3")
    assert (
        EngineConfig.from_parameters({"model_dir": "m"}, {"TRITONLM_QUANTIZATION": "int4"}).quantization
        == "int4"
    )


def test_quality_bounds_on_the_tiny_model(model_dir):
    """docs/features.md's bounds: the tiny random model is far more sensitive than a trained one
    (SmolLM2's numbers are there too), so these bound the measure and its order."""
    prompts = quality.prompt_ids(AutoTokenizer.from_pretrained(model_dir), quality.PROMPTS[:2])
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    refs = quality.reference(base, prompts, new_tokens=12)
    rows = {}
    for name, dtype in (("none", torch.float32), ("int8", torch.float32), ("int4", torch.bfloat16)):
        model, size = quality.quantized(model_dir, name, dtype, quantize.INT4_GROUP)
        rows[name] = quality.measure(name, model, refs, size)
    assert rows["none"].greedy_equal == 1 and rows["none"].mean_kl < 1e-6
    assert rows["int8"].mean_kl < 0.1
    assert rows["int4"].mean_kl < 6
    assert rows["none"].weight_mib > 1.5 * rows["int8"].weight_mib > 1.5 * rows["int4"].weight_mib
