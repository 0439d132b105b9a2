"""The one-pass RMSNorm and SiLU-and-mul (`csrc/cpu_layer_ops.cpp`, swapped in by
tritonlm/worker/fused.py) and the residual add + RMSNorm and rotary embedding of
tritonlm/worker/model_paths/decoder_stack.py: what transformers' modules compute, in the AVX-512 and the plain
loop, on strided rows (the fused projections' parts); swapped in only where their forward is
Llama's, and not at all where the kernels cannot run."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from tritonlm.worker import cpu_kernels, fused

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason=f"{cpu_kernels.unavailable()}")

# fp32 differs from torch by the order of the sum of squares and the last bit of e^x; bf16 and fp16
# round those away but at near-ties.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _rows(rows: int, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


@pytest.mark.parametrize("vectorised", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, width", [(1, 64), (32, 512), (300, 576), (5, 40)])
def test_rms_norm_equals_transformers(dtype, rows, width, vectorised):
    norm = LlamaRMSNorm(width, eps=1e-5).to(dtype)
    norm.weight.data = _rows(1, width, dtype, 1)[0]
    x = _rows(rows, width, dtype, 2)
    out = torch.full_like(x, float("nan"))
    cpu_kernels.kernels().rms_norm(out, x, norm.weight, norm.variance_epsilon, vectorised)
    torch.testing.assert_close(out, norm(x), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("vectorised", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, width", [(1, 64), (32, 1536), (200, 48), (3, 24)])
def test_silu_and_mul_equals_torch_on_the_halves_of_one_projection(dtype, rows, width, vectorised):
    both = _rows(rows, 2 * width, dtype, 3)
    gate, up = both[:, :width], both[:, width:]  # strided rows, as the fused gate/up output gives
    out = torch.full_like(gate, float("nan"))
    cpu_kernels.kernels().silu_and_mul(out, gate, up, vectorised)
    torch.testing.assert_close(out, F.silu(gate) * up, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("vectorised", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, width", [(1, 64), (32, 512), (7, 40)])
def test_add_rms_norm_sums_into_the_residual_and_normalises_it(dtype, rows, width, vectorised):
    norm = LlamaRMSNorm(width, eps=1e-6).to(dtype)
    norm.weight.data = _rows(1, width, dtype, 6)[0]
    residual, both = _rows(rows, width, dtype, 7), _rows(rows, 2 * width, dtype, 8)
    x = both[:, width:]  # strided rows
    expected_residual = residual + x
    out = torch.full_like(residual, float("nan"))
    cpu_kernels.kernels().add_rms_norm(out, residual, x, norm.weight, 1e-6, vectorised)
    assert torch.equal(residual, expected_residual)  # one rounding of the sum, as torch's add
    torch.testing.assert_close(out, norm(expected_residual), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def _rotary_case(dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, dim: int):
    """A fused q/k/v projection's output [tokens, heads + 2 kv_heads, dim] and transformers' cos and
    sin [tokens, dim] at scattered positions."""
    config = AutoConfig.for_model("llama", hidden_size=heads * dim, num_attention_heads=heads, head_dim=dim)
    rotary = LlamaRotaryEmbedding(config)
    qkv = _rows(tokens, (heads + 2 * kv_heads) * dim, dtype, 9).view(tokens, -1, dim)
    positions = torch.randint(0, 2000, (1, tokens), generator=torch.Generator().manual_seed(10))
    cos, sin = rotary(qkv[None], positions)
    return qkv, cos[0], sin[0]


@pytest.mark.parametrize("vectorised", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens, heads, kv_heads, dim", [(32, 8, 4, 64), (5, 9, 3, 64), (3, 4, 2, 24)])
def test_rotary_in_place_is_transformers_apply_rotary_pos_emb(
    dtype, tokens, heads, kv_heads, dim, vectorised
):
    qkv, cos, sin = _rotary_case(dtype, tokens, heads, kv_heads, dim)
    q, k = (part.transpose(0, 1)[None] for part in qkv.split([heads, kv_heads, kv_heads], dim=1)[:2])
    q_expected, k_expected = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    value = qkv[:, heads + kv_heads :].clone()
    cpu_kernels.kernels().rotary(qkv[:, : heads + kv_heads], cos, sin, vectorised)  # q and k heads at once
    # Each product rounded, then the sum: torch's own roundings (no fused multiply-add), bitwise.
    assert torch.equal(qkv[:, :heads], q_expected[0].transpose(0, 1))
    assert torch.equal(qkv[:, heads : heads + kv_heads], k_expected[0].transpose(0, 1))
    assert torch.equal(qkv[:, heads + kv_heads :], value)  # the value heads untouched


def test_bfloat16_rows_are_torchs_bitwise_away_from_near_ties():
    x, both = _rows(64, 512, torch.bfloat16, 4), _rows(64, 3072, torch.bfloat16, 5)
    norm = LlamaRMSNorm(512, eps=1e-6).to(torch.bfloat16)
    out, hidden = torch.empty_like(x), torch.empty(64, 1536, dtype=torch.bfloat16)
    cpu_kernels.kernels().rms_norm(out, x, norm.weight, 1e-6, True)
    cpu_kernels.kernels().silu_and_mul(hidden, both[:, :1536], both[:, 1536:], True)
    assert torch.equal(out, norm(x))
    assert torch.equal(hidden, F.silu(both[:, :1536]) * both[:, 1536:])


def test_fuse_swaps_llama_norms_and_mlps_and_keeps_the_logits(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    packed = copy.deepcopy(model)
    fused.fuse(packed)
    layer = packed.model.layers[0]
    assert isinstance(layer.input_layernorm, fused.FusedRMSNorm)
    assert isinstance(packed.model.norm, fused.FusedRMSNorm)
    assert layer.mlp.forward.__func__ is fused.silu_mlp_forward
    ids = torch.randint(5, 4000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, model(ids).logits, atol=1e-3, rtol=0)


def test_another_norm_formula_is_left_alone():
    class OnePlusWeightNorm(LlamaRMSNorm):  # Gemma's kind: (1 + weight) * x
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (1 + self.weight) * x

    assert fused.same_forward(LlamaRMSNorm, LlamaRMSNorm)
    assert not fused.same_forward(OnePlusWeightNorm, LlamaRMSNorm)


def test_without_the_kernels_the_model_keeps_torchs_ops(model_dir, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "unavailable", lambda: "this CPU has no AVX-512F")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert fused.fuse(model) > 0  # the projections still fuse
    layer = model.model.layers[0]
    assert isinstance(layer.input_layernorm, LlamaRMSNorm)
    assert "forward" not in vars(layer.mlp)
