"""The int8 linear method (tritonlm/worker/linear/int8.py): per-output-channel symmetric int8 weights
multiplied by torch's CPU kernel as F.linear multiplies their dequantized form."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from tritonlm.worker import linear
from tritonlm.worker.linear.int8 import Int8Packed, Int8Weight


def _weight(out_features: int = 48, in_features: int = 64) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(0)) * 0.05


def test_quantize_rounds_each_row_to_half_a_level():
    weight = _weight()
    weight[3] = 0  # an all-zero row quantizes to zeros
    q = Int8Weight.quantize(weight)
    assert q.q.dtype == torch.int8 and q.q.abs().max() <= 127 and q.scales.shape == (48,)
    error = (q.dequantize() - weight).abs()
    assert (error <= q.scales[:, None] / 2 + 1e-7).all()
    assert q.dequantize()[3].eq(0).all()
    assert q.nbytes == 48 * 64 + 48 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_computes_f_linear_of_the_dequantized_weight(dtype):
    q = Int8Weight.quantize(_weight().to(dtype))
    bias = torch.randn(48).to(dtype)
    x = torch.randn(2, 5, 64).to(dtype)
    for b in (bias, None):
        projection = linear.prepare("model.layers.0.mlp.down_proj", q, b)
        assert projection.method == "int8"
        got = projection(x)
        expected = functional.linear(x.float(), q.dequantize().float(), None if b is None else b.float())
        assert got.shape == (2, 5, 48) and got.dtype == dtype
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


def test_stacked_weights_keep_their_rows():
    a, b = Int8Weight.quantize(_weight(16)), Int8Weight.quantize(_weight(32))
    both = Int8Weight.cat([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_the_method_says_what_it_cannot_hold():
    q = Int8Weight.quantize(_weight())
    assert Int8Packed.supports(q) is None and linear.choose("x", q) is Int8Packed
    assert Int8Packed.supports(Int8Weight(q.q.to("meta"), q.scales)) == "CPU only, not meta"
    assert "float64" in Int8Packed.supports(Int8Weight(q.q, q.scales, torch.float64))
