"""The `gguf` linear method (`linear/gguf.py`, `csrc/cpu_gguf.cpp`): Q8_0 and Q6_K weights held as
the file's blocks. Decoded, they equal `gguf.quants.dequantize`'s values exactly; multiplied, torch's
matmul on those values within fp32 summation and one rounding (bf16 past `MAX_ROWS`: the tile is
decoded to bf16, as a dequantized bf16 model's weight is), in the AVX-512 loops and the plain C++
ones (forced), for 1, 2, 3 and 17 rows, odd shapes, both activation dtypes, with and without bias."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Type
from gguf import dequantize, quantize

from tests.gguf_helpers import random_k
from tritonlm.worker import cpu_kernels, linear
from tritonlm.worker.linear import gguf
from tritonlm.worker.linear.gguf import GgufBlocks, Q6_KWeight, Q8_0Weight

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason=f"{cpu_kernels.unavailable()}")

ROUNDING = {torch.float32: 2**-23, torch.bfloat16: 2**-7}
PLAIN, AVX512, BEST = 0, 1, 2
SHAPES = {Type.Q8_0: [(37, 96), (5, 32)], Type.Q6_K: [(37, 512), (3, 256)]}  # [out, in], odd outputs


def _blocks(kind: Type, out_features: int, in_features: int, seed: int) -> np.ndarray:
    if kind == Type.Q6_K:
        return random_k((out_features, in_features), kind, seed)
    values = np.random.default_rng(seed).standard_normal((out_features, in_features)).astype(np.float32)
    return quantize(values * 0.1, kind)


def _weight(kind: Type, shape: tuple[int, int], dtype: torch.dtype, seed: int = 1):
    data = torch.from_numpy(_blocks(kind, *shape, seed))
    return gguf.WEIGHTS[kind](data, shape[1], dtype)


def _reference(weight) -> torch.Tensor:
    values = dequantize(weight.blocks.numpy(), weight.kind).astype(np.float32)
    return torch.from_numpy(values).reshape(weight.shape)


def _assert_matmul(got, x, dense, bias, weight_rounding: float = 1e-6) -> None:
    """got within fp32 summation (and `weight_rounding` of each product) and one rounding."""
    exact = x.double() @ dense.double().T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ dense.double().abs().T
    bound = ROUNDING[x.dtype] * exact.abs() + weight_rounding * magnitude + 1e-30
    assert got.dtype == x.dtype and got.shape == exact.shape
    assert ((got.double() - exact).abs() <= bound).all(), (got.double() - exact).abs().max()


@pytest.mark.parametrize("level", [PLAIN, AVX512, BEST])
@pytest.mark.parametrize("kind", [Type.Q8_0, Type.Q6_K])
def test_decoded_values_equal_the_gguf_packages(kind, level):
    for shape in SHAPES[kind]:
        weight = _weight(kind, shape, torch.float32)
        for dtype in (torch.float32, torch.bfloat16):
            out = torch.empty(shape, dtype=dtype)
            cpu_kernels.kernels().gguf_dequantize(out, weight.blocks, int(kind), level)
            assert torch.equal(out, _reference(weight).to(dtype))
        assert torch.equal(weight.dequantize(), _reference(weight))


@pytest.mark.parametrize("level", [PLAIN, AVX512, BEST])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", [Type.Q8_0, Type.Q6_K])
@pytest.mark.parametrize("rows", [1, 2, 3, 17])
def test_projection_equals_matmul_on_the_dequantized_weight(rows, kind, dtype, level, monkeypatch):
    monkeypatch.setattr(gguf, "LEVEL", level)
    for out_features, in_features in SHAPES[kind]:
        monkeypatch.setattr(gguf, "TILE_BYTES", 2 * in_features * dtype.itemsize)  # tiles of 2 outputs
        weight = _weight(kind, (out_features, in_features), dtype)
        bias = torch.randn(out_features, generator=torch.Generator().manual_seed(rows)).to(dtype)
        x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(dtype)
        many = rows > gguf.MAX_ROWS
        rounded = 2**-8 if many and dtype == torch.bfloat16 else 1e-6  # the tile decoded to bf16
        for b in (bias, None):
            projection = GgufBlocks.prepare(weight, b)
            assert projection.level == level
            _assert_matmul(projection(x), x, _reference(weight), b, rounded)
            gemv = cpu_kernels.kernels().gguf_gemv(x, weight.blocks, int(kind), b, level)
            _assert_matmul(gemv, x, _reference(weight), b)  # the kernel alone, 8 rows a pass


def test_both_loops_agree_and_rows_are_independent():
    weight = _weight(Type.Q6_K, (37, 512), torch.float32)
    x = torch.randn(9, 512, generator=torch.Generator().manual_seed(3))
    ops = cpu_kernels.kernels()
    plain, vector = (ops.gguf_gemv(x, weight.blocks, int(Type.Q6_K), None, level) for level in (0, 1))
    torch.testing.assert_close(plain, vector, atol=1e-5, rtol=1e-5)
    one = ops.gguf_gemv(x[4:5], weight.blocks, int(Type.Q6_K), None, 1)
    assert torch.equal(one[0], vector[4])  # a row's result does not depend on the others'


def test_weights_stack_and_reorder_as_blocks():
    a, b = _weight(Type.Q8_0, (5, 64), torch.float32, 1), _weight(Type.Q8_0, (3, 64), torch.float32, 2)
    both = Q8_0Weight.cat([a, b])
    assert both.shape == (8, 64) and torch.equal(
        both.dequantize(), torch.cat([a.dequantize(), b.dequantize()])
    )
    order = torch.tensor([2, 0, 1, 4, 3])
    assert torch.equal(a.rows(order).dequantize(), a.dequantize()[order])
    assert both.nbytes == 8 * 2 * 34


def test_what_the_kernels_cannot_take_is_refused_or_dequantized():
    ops = cpu_kernels.kernels()
    weight = _weight(Type.Q6_K, (3, 256), torch.float32)
    with pytest.raises(RuntimeError, match="are not the blocks'"):
        ops.gguf_gemv(torch.zeros(1, 512), weight.blocks, int(Type.Q6_K), None, 1)
    with pytest.raises(RuntimeError, match="is not Q8_0"):
        ops.gguf_gemv(torch.zeros(1, 256), weight.blocks, 12, None, 1)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.gguf_gemv(torch.zeros(1, 256, dtype=torch.float16), weight.blocks, int(Type.Q6_K), None, 1)
    with pytest.raises(ValueError, match="bytes per row"):
        Q6_KWeight(weight.blocks, 512)
    half = Q6_KWeight(weight.blocks, 256, torch.float16)
    assert "float16" in GgufBlocks.supports(half)
    assert linear.choose("model.layers.0.mlp.down_proj", half) is None  # prepare dequantizes it
    assert linear.choose("model.layers.0.mlp.down_proj", weight) is GgufBlocks
