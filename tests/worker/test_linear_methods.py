"""Linear methods (tritonlm/worker/linear): each holds a projection's weight in its own form and
computes `x @ weightᵀ + bias` as F.linear does; `choose` takes the best that holds a weight."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch.nn import functional
from transformers import AutoModelForCausalLM

from tritonlm.lora.layers import LoraLayers
from tritonlm.worker import fused, linear
from tritonlm.worker.linear import METHODS
from tritonlm.worker.linear.dense import DenseTorch
from tritonlm.worker.linear.gemv import GemvDense
from tritonlm.worker.linear.onednn import OneDnnPacked

DTYPES = [torch.float32, torch.bfloat16]


def _weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=gen).to(dtype)
    bias = torch.randn(48, generator=gen).to(dtype)
    x = torch.randn(5, 64, generator=gen).to(dtype)
    return weight, bias, x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_computes_f_linear(name, dtype):
    weight, bias, x = _weights(dtype)
    method = METHODS[name]
    if method.holds is not torch.Tensor:
        pytest.skip(f"{name} holds {method.holds.__name__}, not dense weights")
    if method.supports(weight) is not None:
        pytest.skip(f"{name}: {method.supports(weight)}")
    for b in (bias, None):
        projection = method.prepare(weight, b)
        assert (projection.method, projection.in_features, projection.out_features) == (name, 64, 48)
        expected = functional.linear(x, weight, b)
        got = projection(x)
        assert got.shape == expected.shape and got.dtype == dtype
        tolerance = 0 if dtype == torch.float32 else 1e-2  # bf16 outputs round either way
        torch.testing.assert_close(got, expected, atol=1e-4 + tolerance, rtol=tolerance)
        assert projection(x[None]).shape == (1, 5, 48)  # any leading dimensions


def test_the_dense_method_holds_any_weight():
    assert DenseTorch.supports(torch.zeros(2, 2, dtype=torch.float16)) is None
    projection = DenseTorch.prepare(torch.eye(2, dtype=torch.float16), None)
    assert projection(torch.ones(1, 2, dtype=torch.float16)).tolist() == [[1.0, 1.0]]


def test_onednn_says_what_it_cannot_hold():
    assert "float16" in OneDnnPacked.supports(torch.zeros(2, 2, dtype=torch.float16))
    assert OneDnnPacked.supports(torch.zeros(2, 2, device="meta")) == "CPU only, not meta"


def test_choose_takes_the_best_method_that_holds_the_weight():
    assert list(METHODS)[-1] == "torch"  # the method of last resort
    half = torch.zeros(4, 4, dtype=torch.float16)
    assert linear.choose("model.layers.0.mlp.down_proj", half) is DenseTorch
    fp32 = torch.zeros(4, 4)
    best = next(m for m in (GemvDense, OneDnnPacked, DenseTorch) if m.supports(fp32) is None)
    assert linear.choose("lm_head", fp32) is best
    assert linear.prepare("lm_head", fp32, None).method == best.name


@pytest.mark.parametrize("name", list(METHODS))
def test_lora_composes_with_every_method(model_dir, monkeypatch, name):
    """LoRA's hooks add to a fused projection computed by any method what a merged weight gives."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if METHODS[name].holds is not torch.Tensor:
        pytest.skip(f"{name}: LoRA over quantized weights: test_quantization.py")
    if METHODS[name].supports(model.lm_head.weight) is not None:
        pytest.skip(f"{name}: {METHODS[name].supports(model.lm_head.weight)}")
    merged = copy.deepcopy(model)
    monkeypatch.setattr(linear, "METHODS", {name: METHODS[name]})
    assert fused.fuse(model) and model.model.layers[0].self_attn.o_proj.projection.method == name
    gen = torch.Generator().manual_seed(0)
    weights = {}
    for key in ((0, "k_proj"), (1, "down_proj")):
        target = merged.get_submodule(f"model.layers.{key[0]}.{'mlp' if 'down' in key[1] else 'self_attn'}")
        target = getattr(target, key[1])
        a = torch.randn(4, target.in_features, generator=gen) * 0.1
        b = torch.randn(target.out_features, 4, generator=gen) * 0.1
        weights[key] = (a, b)
        target.weight.data += b @ a
    adapter = types.SimpleNamespace(weights=weights)
    lora = LoraLayers(model)
    ids = torch.randint(5, 4000, (1, 12), generator=gen)
    with torch.inference_mode(), lora.step([adapter], [12], torch.device("cpu")):
        got = model(ids).logits
    with torch.inference_mode():
        expected = merged(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
