"""The int4 linear method's quantizer (`Int4Weight.quantize`, for `quantization: int4`): group-wise
asymmetric rounding into the kernel's `(q - 8) * scale + zero`, and the kernel computing F.linear of
the dequantized weight."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from tritonlm.worker import linear
from tritonlm.worker.linear.int4 import Int4Weight


def _weight() -> torch.Tensor:
    return torch.randn(48, 128, generator=torch.Generator().manual_seed(0)) * 0.05 + 0.01


@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_rounds_each_group_to_half_a_level(group):
    weight = _weight()
    weight[0, :group] = 0.3  # a constant group is exact
    q = Int4Weight.quantize(weight, group)
    assert q.q.dtype == torch.uint8 and q.q.max() <= 15 and q.scales.shape == (48, 128 // group)
    error = (q.dequantize() - weight).abs()
    scales = q.scales.repeat_interleave(group, dim=1)
    assert (error <= scales / 2 + 1e-6).all()
    assert torch.allclose(q.dequantize()[0, :group], torch.tensor(0.3))
    # each group spans its minimum to its maximum
    groups = weight.reshape(48, -1, group)
    assert torch.allclose(q.dequantize().reshape(48, -1, group).amin(-1), groups.amin(-1), atol=1e-6)
    assert torch.allclose(q.dequantize().reshape(48, -1, group).amax(-1), groups.amax(-1), atol=1e-6)


def test_quantize_needs_whole_groups():
    with pytest.raises(ValueError, match="groups of 128"):
        Int4Weight.quantize(torch.zeros(16, 96), 128)


def test_the_kernel_computes_f_linear_of_the_quantized_weight():
    q = Int4Weight.quantize(_weight(), 32)
    assert q.nbytes == 48 * 128 // 2 + 2 * 48 * 4 * 4
    x, bias = torch.randn(3, 128), torch.randn(48)
    projection = linear.prepare("model.layers.0.mlp.down_proj", q, bias)
    assert projection.method == "int4"
    torch.testing.assert_close(
        projection(x), functional.linear(x, q.dequantize(), bias), atol=1e-4, rtol=1e-4
    )
