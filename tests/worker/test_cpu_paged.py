"""The `cpu_paged` backend's kernel (csrc/cpu_attention.cpp) against plain SDPA over the same keys and
values (dtypes, grouped-query shapes, block boundaries, several rows of one sequence as a prefill
chunk or proposals give), its AVX-512 loop against
its plain C++ one, and the fallback to `sdpa` where it cannot run (not built, no AVX-512: forced).
The engine-level parity (greedy, token for token against transformers, both dtypes, preemption,
prefix cache, chunked prefill, proposals) runs on every backend in the tests that take
`attention_backend` (tests/conftest.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tritonlm.config import EngineConfig
from tritonlm.worker import attention, cpu_kernels
from tritonlm.worker.model_runner import ModelRunner

CPU = torch.device("cpu")
needs_kernel = pytest.mark.skipif(
    cpu_kernels.unavailable() is not None, reason=f"cpu_paged: {cpu_kernels.unavailable()}"
)


def paged_problem(lengths: list[int], kv_heads: int, dim: int, block: int, dtype: torch.dtype):
    """Pools holding sequences of `lengths` in shuffled blocks, and their block tables."""
    gen = torch.Generator().manual_seed(sum(lengths) + dim + block)
    counts = [-(-n // block) for n in lengths]
    order = torch.randperm(sum(counts) + 3, generator=gen).tolist()  # a few blocks nobody owns
    tables, used = [], 0
    for count in counts:
        tables.append(order[used : used + count])
        used += count
    width = max(counts)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slots = (len(order)) * block
    keys = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    values = torch.randn(slots, kv_heads, dim, generator=gen).to(dtype)
    return keys, values, tables, table


def reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: list[int], length: int, block: int
) -> torch.Tensor:
    """SDPA in fp32 of one query row [heads, dim] over a sequence's first `length` positions."""
    t = torch.tensor(table)
    slots = (t[:, None] * block + torch.arange(block)).reshape(-1)[:length]
    k, v = keys[slots].transpose(0, 1).float(), values[slots].transpose(0, 1).float()
    out = F.scaled_dot_product_attention(q.float()[:, None], k, v, scale=0.125, enable_gqa=True)
    return out[:, 0]


TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}  # the output's rounding


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    [(8, 4, 64), (9, 3, 64), (4, 4, 32), (16, 1, 128), (4, 2, 80), (18, 1, 64)],  # 80, 18: plain C++
)
@pytest.mark.parametrize("block", [16, 4, 32])
@pytest.mark.parametrize("vectorised", [True, False])
def test_the_kernel_equals_sdpa_over_the_sequences_blocks(dtype, heads, kv_heads, dim, block, vectorised):
    lengths = [1, 15, 16, 17, 33, 100, 64]
    keys, values, tables, table = paged_problem(lengths, kv_heads, dim, block, dtype)
    # Rows: one per sequence, and the last sequence's three proposals (rows seeing 62, 63, 64).
    row_seq = [*range(len(lengths)), 6, 6]
    row_len = [*lengths[:-1], 64, 62, 63]
    query = torch.randn(heads, len(row_seq), dim).to(dtype).transpose(0, 1)  # strided, as the model's
    out = torch.full((len(row_seq), heads, dim), float("nan"), dtype=dtype)
    cpu_kernels.kernels().paged_attention(
        out,
        query,
        keys,
        values,
        table,
        torch.tensor(row_seq, dtype=torch.int32),
        torch.tensor(row_len, dtype=torch.int32),
        block,
        0.125,
        vectorised,
    )
    for r, (s, n) in enumerate(zip(row_seq, row_len, strict=True)):
        expected = reference(query[r], keys, values, tables[s], n, block)
        torch.testing.assert_close(out[r].float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_few_rows_split_by_head_and_many_rows_by_row_give_the_same(dtype, rows):
    """A task per (row, key head) when rows are fewer than twice the threads, else per row."""
    lengths = [7 + 5 * i for i in range(rows)]
    keys, values, tables, table = paged_problem(lengths, 4, 64, 16, dtype)
    query = torch.randn(rows, 8, 64).to(dtype)
    out = torch.empty_like(query)
    seq = torch.arange(rows, dtype=torch.int32)
    lens = torch.tensor(lengths, dtype=torch.int32)
    cpu_kernels.kernels().paged_attention(out, query, keys, values, table, seq, lens, 16, 0.125, True)
    for r, n in enumerate(lengths):
        expected = reference(query[r], keys, values, tables[r], n, 16)
        torch.testing.assert_close(out[r].float(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_a_missing_library_leaves_the_backend_out_naming_make_setup(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_kernels, "LIBRARY", tmp_path / "missing.so")
    cpu_kernels._load.cache_clear()
    try:
        assert cpu_kernels.unavailable() == f"{tmp_path / 'missing.so'} is not built (run `make setup`)"
        assert attention.available_backends(CPU) == ["sdpa"]
    finally:
        cpu_kernels._load.cache_clear()


def test_a_cpu_without_avx512_falls_back_to_sdpa_with_a_log_line():
    """Forced for real: torch told to run this CPU at AVX2 (ATEN_CPU_CAPABILITY), in a fresh process."""
    script = (
        "import logging, torch\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "from tritonlm.worker import attention\n"
        "print(attention.choose('auto', torch.device('cpu')).name)\n"
        "try:\n"
        "    attention.choose('cpu_paged', torch.device('cpu'))\n"
        "except ValueError as error:\n"
        "    print(error)\n"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "sdpa"
    why = "not available on cpu: torch runs this CPU at AVX2, not AVX512"
    assert f"attention_backend auto: sdpa, not cpu_paged ({why})" in done.stderr
    assert done.stdout.splitlines()[1] == f"attention_backend: 'cpu_paged' is {why}; allowed here: auto, sdpa"


@needs_kernel
def test_auto_takes_cpu_paged_in_both_dtypes_and_sdpa_without_the_kernel(model_dir, monkeypatch, caplog):
    def chosen(dtype: str) -> str:
        config = EngineConfig(str(model_dir), dtype=dtype, max_num_seqs=4, max_seq_len=128)
        return ModelRunner(config).attention.name

    assert chosen("bfloat16") == chosen("float32") == "cpu_paged"
    monkeypatch.setattr(cpu_kernels, "unavailable", lambda: "this CPU has no AVX-512F")
    with caplog.at_level(logging.INFO, logger="tritonlm.worker.attention"):
        assert chosen("bfloat16") == "sdpa"
    why = "not available on cpu: this CPU has no AVX-512F"
    assert f"attention_backend auto: sdpa, not cpu_paged ({why})" in caplog.text
