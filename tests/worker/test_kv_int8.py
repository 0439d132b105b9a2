"""`kv_cache_dtype` int8: the quantization (kv_cache.quantize), the kernel's int8 read
(`paged_attention_int8`, AVX-512 and plain C++ loops) against attention over the dequantized values,
the KV bytes per block and blocks for the same memory, the refusals (a backend that does not read
int8, a checkpoint that needs `sdpa`), and the quality bounds on the tiny model through the engine:
the share of a fixed prompt set whose first 32 greedy tokens equal the unquantized cache's, and
the mean next-token KL divergence (client/quant_parity.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from client import quant_parity
from tritonlm.config import ConfigError, EngineConfig
from tritonlm.worker import attention, cpu_kernels
from tritonlm.worker.kv_cache import PagedKVCache, dequantize, quantize
from tritonlm.worker.model_runner import ModelRunner

CPU = torch.device("cpu")
needs_kernel = pytest.mark.skipif(
    cpu_kernels.unavailable() is not None, reason=f"cpu_paged: {cpu_kernels.unavailable()}"
)
# The bounds on the tiny model, whose random weights make near-ties everywhere (measured: 5/12
# prompts agree in float32, mean KL 7.9e-3; 3/12 and 1.4e-2 in bfloat16; running it in bfloat16
# instead of float32 costs 3/12 and 1.2e-2): loose enough for rounding across machines, tight
# enough to catch a wrong scale or a misread row (KL > 0.1). SmolLM2's: docs/features.md.
MIN_AGREEMENT = {"float32": 0.25, "bfloat16": 0.15}
MAX_MEAN_KL = {"float32": 0.02, "bfloat16": 0.03}


def test_quantize_is_absmax_over_127_per_row_and_within_half_a_step():
    x = torch.randn(5, 3, 64) * torch.tensor([0.01, 1.0, 300.0])[None, :, None]
    x[2, 1] = 0  # a zero row stays zero
    q, scale = quantize(x)
    assert q.dtype == torch.int8 and scale.shape == (5, 3) and scale.dtype == torch.float32
    assert q.abs().amax(-1).flatten().tolist().count(127) == 14  # every nonzero row uses the range
    torch.testing.assert_close(scale[scale > 1e-20], x.abs().amax(-1)[scale > 1e-20] / 127)
    assert bool(((dequantize(q, scale) - x).abs() <= scale[..., None] / 2 * 1.0001).all())
    assert bool((dequantize(q, scale)[2, 1] == 0).all())


def int8_problem(lengths: list[int], kv_heads: int, dim: int, block: int):
    """int8 pools (with scales) holding sequences of `lengths` in shuffled blocks, their tables."""
    gen = torch.Generator().manual_seed(sum(lengths) + dim + block)
    counts = [-(-n // block) for n in lengths]
    order = torch.randperm(sum(counts) + 2, generator=gen).tolist()
    tables = [order[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(counts))]
    table = torch.tensor([t + [0] * (max(counts) - len(t)) for t in tables], dtype=torch.int32)
    spread = torch.rand(len(order) * block, kv_heads, 1, generator=gen) * 4  # rows of varied size
    keys, key_scales = quantize(torch.randn(len(order) * block, kv_heads, dim, generator=gen) * spread)
    values, value_scales = quantize(torch.randn(len(order) * block, kv_heads, dim, generator=gen) * spread)
    return (keys, key_scales, values, value_scales), tables, table


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(8, 4, 64), (9, 3, 64), (16, 1, 128), (4, 2, 80)])
@pytest.mark.parametrize("vectorised", [True, False])
def test_the_int8_kernel_equals_sdpa_over_the_dequantized_blocks(dtype, heads, kv_heads, dim, vectorised):
    block = 16
    lengths = [1, 15, 17, 33, 100]
    pools, tables, table = int8_problem(lengths, kv_heads, dim, block)
    row_seq = [*range(len(lengths)), 4]  # the last sequence twice, as a prefill chunk's rows
    row_len = [*lengths, 60]
    query = torch.randn(heads, len(row_seq), dim).to(dtype).transpose(0, 1)  # strided, as the model's
    out = torch.full((len(row_seq), heads, dim), float("nan"), dtype=dtype)
    seq, lens = torch.tensor(row_seq, dtype=torch.int32), torch.tensor(row_len, dtype=torch.int32)
    cpu_kernels.kernels().paged_attention_int8(out, query, *pools, table, seq, lens, block, 0.125, vectorised)
    keys, values = dequantize(*pools[:2]), dequantize(*pools[2:])
    tolerance = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    for r, (s, n) in enumerate(zip(row_seq, row_len, strict=True)):
        t = torch.tensor(tables[s])
        slots = (t[:, None] * block + torch.arange(block)).reshape(-1)[:n]
        k, v = keys[slots].transpose(0, 1), values[slots].transpose(0, 1)
        expected = F.scaled_dot_product_attention(
            query[r].float()[:, None], k, v, scale=0.125, enable_gqa=True
        )
        torch.testing.assert_close(out[r].float(), expected[:, 0], atol=tolerance, rtol=tolerance)


# SmolLM2-135M's KV shapes: 30 layers of 3 KV heads of 64.
SHAPES = {layer: (3, 64, torch.bfloat16) for layer in range(30)}


def test_int8_halves_the_bytes_per_block_and_doubles_the_blocks_for_the_same_memory():
    bf16 = PagedKVCache(16, torch.bfloat16, CPU).bytes_per_block(SHAPES)
    int8 = PagedKVCache(16, torch.bfloat16, CPU, "int8").bytes_per_block(SHAPES)
    assert bf16 == 30 * 2 * 16 * 3 * 64 * 2
    assert int8 == 30 * 2 * 16 * 3 * (64 + 4)  # an fp32 scale per token and head
    assert int8 / bf16 == pytest.approx(0.53, abs=0.01)
    config = EngineConfig("x", max_seq_len=1024, max_num_seqs=32, kv_cache_memory_fraction=0.5)
    blocks = {b: config.kv_cache_size(b, "cpu", 1 << 30).kv_cache_blocks for b in (bf16, int8)}
    assert blocks[int8] / blocks[bf16] == pytest.approx(128 / 68, rel=0.01)  # ~1.9x


def test_the_pools_are_int8_with_scales_and_copy_on_write_copies_the_scales():
    cache = PagedKVCache(4, torch.bfloat16, CPU, "int8")
    cache.allocate(3, {0: (2, 16, torch.bfloat16)})
    assert cache.keys[0].dtype == torch.int8 and cache.key_scales[0].shape == (16, 2)
    assert cache.memory_bytes() == 4 * cache.bytes_per_block({0: (2, 16, torch.bfloat16)})
    key, value = torch.randn(4, 2, 16).bfloat16(), torch.randn(4, 2, 16).bfloat16()
    cache.write(0, torch.arange(4), key, value)
    torch.testing.assert_close(
        dequantize(cache.keys[0][:4], cache.key_scales[0][:4]), key.float(), atol=0.03, rtol=0.02
    )
    cache.copy_blocks([(0, 2)])
    for pool in (cache.keys, cache.values, cache.key_scales, cache.value_scales):
        assert torch.equal(pool[0][8:12], pool[0][:4])


def test_a_backend_that_does_not_read_int8_is_refused_naming_both_settings():
    with pytest.raises(ConfigError, match=r"kv_cache_dtype: must be one of auto, int8, got 'fp4'"):
        EngineConfig(kv_cache_dtype="fp4")
    why = r"kv_cache_dtype: 'int8' is not read by attention_backend 'sdpa'; 'cpu_paged' does"
    if cpu_kernels.unavailable() is None:
        with pytest.raises(ConfigError, match=why):
            attention.choose("sdpa", CPU, kv_cache_dtype="int8")
        assert attention.choose("auto", CPU, kv_cache_dtype="int8").name == "cpu_paged"
    with pytest.raises(ConfigError, match="kv_cache_dtype: 'int8' is not read by attention_backend 'sdpa'"):
        attention.backend_class("sdpa")(16, torch.float32, CPU, "int8")


def test_without_the_kernel_int8_is_refused_saying_why(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "unavailable", lambda: "this CPU has no AVX-512F")
    with pytest.raises(
        ConfigError, match=r"'cpu_paged' does but is not available on cpu: this CPU has no AVX-512F"
    ):
        attention.choose("auto", CPU, kv_cache_dtype="int8")


@needs_kernel
def test_a_checkpoint_that_needs_sdpa_is_refused_with_int8():
    needs = {"sliding_window": "sliding_window 4096 < max_seq_len 8192"}
    assert attention.choose("auto", CPU, needs).name == "sdpa"  # unquantized: sdpa serves it
    match = r"kv_cache_dtype: 'int8' cannot serve this checkpoint exactly: its attention needs sliding_window"
    for name in ("auto", "cpu_paged"):
        with pytest.raises(ConfigError, match=match):
            attention.choose(name, CPU, needs, kv_cache_dtype="int8")


@pytest.fixture(scope="module")
def tiny_prompts(model_dir):
    return quant_parity.tokenized(str(model_dir))


@needs_kernel
@pytest.mark.parametrize("dtype", ["bfloat16"])  # the CPU's default; float32's int8 read: the kernel tests
def test_int8_kv_agrees_with_the_unquantized_cache_within_the_bounds(model_dir, tiny_prompts, dtype):
    settings = {"dtype": dtype, "max_num_seqs": 12, "max_seq_len": 128, "enable_prefix_caching": False}
    reference = ModelRunner(EngineConfig(str(model_dir), **settings))
    int8 = ModelRunner(EngineConfig(str(model_dir), kv_cache_dtype="int8", **settings))
    assert int8.attention.name == "cpu_paged" and int8.attention.cache.keys[0].dtype == torch.int8
    parity = quant_parity.compare(reference, int8, tiny_prompts, tokens=32)
    print(f"{dtype}: agreement {parity.agreement:.2f}, mean KL {parity.mean_kl:.2e}")
    assert parity.agreement >= MIN_AGREEMENT[dtype]
    assert 0 < parity.mean_kl <= MAX_MEAN_KL[dtype]
