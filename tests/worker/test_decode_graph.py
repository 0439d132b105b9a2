"""Decode graphs (tritonlm/worker/decode_graph.py, `decode_graphs`): the buckets chosen right; a
decode step through a bucket's static buffers, padded rows included, gives the logits of the
ordinary step bitwise (the one call left eager, so padding alone is compared), in both dtypes; the
compiled one call gives the same greedy tokens (logits bitwise in bfloat16, within 1e-4 in float32:
Inductor's own cos and sin for the rotary table round differently) — compiling takes tens of
seconds a bucket here, so those run only when asked (TRITONLM_TEST_COMPILE=1); the CUDA graph
capture is skipped, naming CUDA, where torch sees none."""

from __future__ import annotations

import os

import pytest
import torch
from engine_helpers import compare_graph_steps

from tritonlm.config import EngineConfig
from tritonlm.platforms.base import Platform
from tritonlm.platforms.cpu import CpuPlatform
from tritonlm.platforms.cuda import CudaPlatform
from tritonlm.settings import ConfigError
from tritonlm.worker import cpu_kernels, decode_graph
from tritonlm.worker.model_runner import ModelRunner

NO_KERNELS = cpu_kernels.unavailable()
needs_kernels = pytest.mark.skipif(NO_KERNELS is not None, reason=f"{NO_KERNELS}")
COMPILE = os.environ.get("TRITONLM_TEST_COMPILE") == "1"
needs_compile = pytest.mark.skipif(
    not COMPILE, reason="compiles with Inductor (tens of seconds a bucket): TRITONLM_TEST_COMPILE=1"
)


def test_buckets_are_powers_of_two_up_to_max_num_seqs():
    assert decode_graph.buckets(1) == [1]
    assert decode_graph.buckets(6) == [1, 2, 4, 6]
    assert decode_graph.buckets(32) == [1, 2, 4, 8, 16, 32]
    sizes = decode_graph.buckets(6)
    assert [decode_graph.bucket_for(n, sizes) for n in range(1, 8)] == [1, 2, 4, 4, 6, 6, None]


def _runner(model_dir, dtype: str, max_num_seqs: int = 4, **settings) -> ModelRunner:
    return ModelRunner(
        EngineConfig(
            str(model_dir),
            dtype=dtype,
            attention_backend=settings.pop("attention_backend", "cpu_paged"),
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=48,
            block_size=8,
            max_seq_len=128,
            decode_graphs=True,
            **settings,
        )
    )


@needs_kernels
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_padded_rows_never_change_the_real_rows(model_dir, dtype, monkeypatch):
    monkeypatch.setattr(CpuPlatform, "one_call", Platform.one_call)  # eager: padding alone compared
    runner = _runner(model_dir, dtype)
    assert runner.decode_graphs.sizes == [1, 2, 4]
    compared = compare_graph_steps(runner, atol=0)
    assert 3 in compared and 1 in compared  # padded to 4, and a bucket exactly full


class _EagerCpu(CpuPlatform):
    """The CPU with its one call left eager: a stand-in for CUDA's platform, whose graphs run sdpa's
    static step (`attention/paged.py`), so that that step and its padding are compared here."""

    name = "eager-cpu"
    one_call = Platform.one_call


def test_sdpa_static_step_gives_the_ordinary_steps_logits(model_dir):
    runner = ModelRunner(
        EngineConfig(
            str(model_dir), dtype="float32", attention_backend="sdpa", model_path="transformers",
            max_num_seqs=4, max_num_batched_tokens=48, block_size=8, max_seq_len=128,
        )
    )  # fmt: skip
    runner.attention.workspace = None  # as on CUDA: the eager decodes gather their blocks
    platform = _EagerCpu(torch.device("cpu"))
    graphs = decode_graph.DecodeGraphs(runner.generic, runner.attention, platform, [1, 2, 4], width=16)
    runner.decode_graphs = graphs
    compared = compare_graph_steps(runner, atol=1e-4)  # another order of the same sums
    assert 3 in compared and 1 in compared  # padded to 4, and a bucket exactly full


def test_decode_graphs_are_off_by_default_on_the_cpu(model_dir):
    assert ModelRunner(EngineConfig(str(model_dir), dtype="float32", max_num_seqs=2)).decode_graphs is None


def test_a_model_with_recurrent_layers_never_gets_them(model_dir):
    plain = ModelRunner(EngineConfig(str(model_dir), dtype="float32", max_num_seqs=2))
    why = decode_graph.DecodeGraphs.build(
        plain.generic, plain.attention, _EagerCpu(torch.device("cpu")), 2, 128, recurrent=True
    )
    assert why == "the model has recurrent layers, whose state a static step does not carry"


@needs_kernels
def test_graphs_that_fail_to_be_made_are_off_unset_and_refused_set(model_dir, monkeypatch, caplog):
    def refuse(self, step):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(CpuPlatform, "captures_graphs", True)  # as CUDA: on when unset
    monkeypatch.setattr(CpuPlatform, "one_call", refuse)
    config = dict(dtype="float32", attention_backend="cpu_paged", max_num_seqs=2)
    assert ModelRunner(EngineConfig(str(model_dir), **config)).decode_graphs is None
    assert "decode_graphs off: making the graphs failed: operation not permitted" in caplog.text
    with pytest.raises(ConfigError, match="decode_graphs: true cannot run here: making the graphs failed"):
        ModelRunner(EngineConfig(str(model_dir), decode_graphs=True, **config))


def test_decode_graphs_need_cpu_paged(model_dir):
    with pytest.raises(ConfigError, match="decode_graphs.*cpu_paged"):
        _runner(model_dir, "float32", attention_backend="sdpa")


@needs_kernels
@needs_compile
@pytest.mark.parametrize(("dtype", "atol"), [("float32", 1e-4), ("bfloat16", 0)])
def test_compiled_steps_give_the_ordinary_steps_tokens(model_dir, dtype, atol):
    runner = _runner(model_dir, dtype, max_num_seqs=2)
    compared = compare_graph_steps(runner, atol)
    assert 1 in compared and 2 in compared


@pytest.mark.skipif(
    CudaPlatform.unavailable() is not None, reason=f"needs CUDA: {CudaPlatform.unavailable()}"
)
def test_cuda_graph_replays_on_what_the_static_inputs_hold():
    platform = CudaPlatform(torch.device("cuda"))
    x = torch.zeros(4, 8, device="cuda")
    weight = torch.randn(8, 8, device="cuda")
    call = platform.one_call(lambda: torch.relu(x @ weight) + 1)
    for seed in range(3):
        x.copy_(torch.randn(4, 8, generator=torch.Generator().manual_seed(seed)))
        assert torch.equal(call(), torch.relu(x @ weight) + 1)
