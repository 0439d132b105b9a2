"""The small-row projection kernel (`csrc/cpu_gemv.cpp`) and its linear method (`linear/gemv.py`):
F.linear's result within fp32 summation and one rounding, in every loop (plain C++, AVX-512F,
AVX-512 BF16), for 1 to 9 rows, tails of N and K, strided rows, with and without bias; past
`MAX_ROWS` the projection is exactly the GEMM it keeps."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from tritonlm.worker import cpu_kernels, linear
from tritonlm.worker.linear import gemv
from tritonlm.worker.linear.gemv import GemvDense

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason=f"{cpu_kernels.unavailable()}")

# One rounding of the result to its dtype (a unit in the last place, either way of a tie).
ROUNDING = {torch.float32: 2**-23, torch.bfloat16: 2**-7, torch.float16: 2**-10}
PLAIN, AVX512, BEST = 0, 1, 2


def _tensor(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _assert_linear(
    got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> None:
    """got within fp32 summation error (relative to the sum of |products|) and one rounding."""
    exact = functional.linear(x.double(), weight.double(), None if bias is None else bias.double())
    magnitude = functional.linear(x.double().abs(), weight.double().abs())
    bound = ROUNDING[x.dtype] * exact.abs() + 1e-6 * magnitude + 1e-30
    assert got.dtype == x.dtype and got.shape == exact.shape
    assert ((got.double() - exact).abs() <= bound).all(), (got.double() - exact).abs().max()


@pytest.mark.parametrize("level", [PLAIN, AVX512, BEST])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("rows", range(1, 10))
def test_gemv_equals_f_linear(rows, dtype, level):
    for n, k in [(45, 67), (64, 576), (7, 33)]:  # tails of N (blocks of rows) and of K (16, 32 wide)
        wide = _tensor(rows, k + 5, dtype=dtype, seed=rows)
        x = wide[:, 3 : 3 + k]  # strided rows, as a fused projection's slice gives
        weight, bias = _tensor(n, k, dtype=dtype, seed=1), _tensor(n, dtype=dtype, seed=2)
        for b in (bias, None):
            _assert_linear(cpu_kernels.kernels().gemv(x, weight, b, level), x, weight, b)


def test_gemv_refuses_what_it_cannot_compute():
    ops = cpu_kernels.kernels()
    with pytest.raises(RuntimeError, match="weight in x's dtype"):
        ops.gemv(torch.zeros(1, 4), torch.zeros(2, 4, dtype=torch.bfloat16), None, BEST)
    with pytest.raises(RuntimeError, match="x's K"):
        ops.gemv(torch.zeros(1, 4), torch.zeros(2, 5), None, BEST)
    with pytest.raises(RuntimeError, match="bias"):
        ops.gemv(torch.zeros(1, 4), torch.zeros(2, 4), torch.zeros(3), BEST)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_projection_runs_the_kernel_at_few_rows_and_the_gemm_past_them(dtype):
    weight, bias = _tensor(48, 64, dtype=dtype, seed=3), _tensor(48, dtype=dtype, seed=4)
    projection = GemvDense.prepare(weight, bias)
    assert projection.weight.data_ptr() == weight.data_ptr()  # as loaded: a tied LM head shares it
    few = _tensor(2, gemv.MAX_ROWS // 2, 64, dtype=dtype, seed=5)
    assert torch.equal(
        projection(few), cpu_kernels.kernels().gemv(few.view(-1, 64), weight, bias, BEST).view(2, -1, 48)
    )
    many = _tensor(gemv.MAX_ROWS + 1, 64, dtype=dtype, seed=6)
    assert torch.equal(projection(many), projection.many_rows(many))
    _assert_linear(projection(few[0]), few[0], weight, bias)


def test_gemv_method_says_what_it_cannot_hold():
    assert "float16" in GemvDense.supports(torch.zeros(2, 2, dtype=torch.float16))
    assert GemvDense.supports(torch.zeros(2, 2, device="meta")) == "CPU only, not meta"
    assert linear.choose("lm_head", torch.zeros(4, 4, dtype=torch.bfloat16)) is GemvDense
