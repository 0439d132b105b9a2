"""GGUF's block types as the worker holds them: the 4-bit types exactly as the `int4` method's
`Int4Weight` (each 32 values one scale and one zero), multiplied by torch's int4 kernel as F.linear
multiplies the dequantized weight; the other types dequantized by the `gguf` package."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Type
from gguf import dequantize, quantize
from torch.nn import functional

from tests.gguf_helpers import q4_k, random_k
from tritonlm.worker import gguf_blocks as blocks
from tritonlm.worker import linear
from tritonlm.worker.linear import Int4Weight
from tritonlm.worker.linear.int4 import Int4Packed

ROWS, COLS = 48, 512


def _values(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, COLS)).astype(np.float32)


def _blocks(kind: Type) -> np.ndarray:
    if kind == Type.Q4_K:
        return q4_k(_values())
    return quantize(_values(), kind)


@pytest.mark.parametrize("kind", [Type.Q4_0, Type.Q4_1, Type.Q4_K])
def test_the_4_bit_types_are_int4_weights_exactly(kind):
    data = _blocks(kind)
    weight = blocks.int4_weight(data, kind, torch.float32)
    assert weight.shape == (ROWS, COLS) and weight.group == 32
    assert weight.q.dtype == torch.uint8 and int(weight.q.max()) <= 15
    np.testing.assert_array_equal(weight.dequantize().numpy(), dequantize(data, kind))


def test_q4_k_random_blocks_too():
    """Any bytes are a valid Q4_K block (given finite scales): every scale and min bit is read."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, (ROWS * COLS // 256, 144), dtype=np.uint8)
    data[:, 0:4] = np.full((len(data), 2), 0.01, np.float16).view(np.uint8)
    data = data.reshape(ROWS, -1)
    weight = blocks.int4_weight(data, Type.Q4_K, torch.float32)
    np.testing.assert_array_equal(weight.dequantize().numpy(), dequantize(data, Type.Q4_K))


@pytest.mark.parametrize("kind", [Type.Q8_0, Type.Q5_0, Type.F16, Type.BF16, Type.F32, Type.Q5_K, Type.Q6_K])
def test_other_types_are_dequantized_by_gguf(kind):
    data = (
        random_k((ROWS, COLS), kind, seed=2) if kind in (Type.Q5_K, Type.Q6_K) else quantize(_values(), kind)
    )
    dense = blocks.dense(data, kind, (ROWS, COLS), torch.float32)
    expected = data if kind in (Type.F32, Type.F16) else dequantize(data, kind)
    np.testing.assert_array_equal(dense.numpy(), np.asarray(expected, dtype=np.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_int4_projection_is_f_linear_of_the_dequantized_weight(dtype):
    weight = blocks.int4_weight(_blocks(Type.Q4_1), Type.Q4_1, dtype)
    bias = torch.randn(ROWS).to(dtype)
    x = torch.randn(2, 3, COLS).to(dtype)
    assert linear.choose("model.layers.0.mlp.down_proj", weight) is Int4Packed
    projection = linear.prepare("model.layers.0.mlp.down_proj", weight, bias)
    got = projection(x)
    expected = functional.linear(x.float(), weight.dequantize().float(), bias.float())
    assert got.shape == (2, 3, ROWS) and got.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2  # bf16: activations and scales rounded
    torch.testing.assert_close(got.float(), expected, atol=tolerance * 10, rtol=tolerance)


def test_stacked_and_reordered_rows_keep_their_values():
    a = blocks.int4_weight(_blocks(Type.Q4_0), Type.Q4_0, torch.float32)
    b = blocks.int4_weight(quantize(_values(3), Type.Q4_1), Type.Q4_1, torch.float32)
    stacked = Int4Weight.cat([a, b])
    torch.testing.assert_close(stacked.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    order = torch.randperm(ROWS)
    torch.testing.assert_close(a.rows(order).dequantize(), a.dequantize()[order])


def test_a_shape_the_kernel_does_not_take_is_dequantized_with_a_warning(caplog):
    weight = blocks.int4_weight(quantize(_values()[:40], Type.Q4_0), Type.Q4_0, torch.float32)  # 40 % 16
    assert "multiples of 16" in Int4Packed.supports(weight) and linear.choose("x", weight) is None
    with caplog.at_level(logging.WARNING):
        projection = linear.prepare("model.layers.0.mlp.up_proj", weight, None)
    assert projection.method != "int4" and "model.layers.0.mlp.up_proj" in caplog.text
    x = torch.randn(3, COLS)
    torch.testing.assert_close(projection(x), functional.linear(x, weight.dequantize()), atol=1e-4, rtol=1e-4)
