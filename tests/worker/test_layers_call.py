"""A decode step's decoder layers in one C++ call (tritonlm/worker/model_paths/layers_call.py): at one
and two rows its logits are the Python loop's bitwise, in both dtypes, for the layer shapes it
takes (Llama's, Qwen2's q/k/v biases, Phi-3's packed projections and partial rotary embedding) and
the linear methods it calls (gemv's dense weights, `quantization: int4`, a GGUF file of every type:
4-bit, Q8_0, Q6_K, dense and dequantized layers), and every such step takes it; the layers it does
not take (Qwen3's head norms, Granite's multiplier, an int8 KV cache, another backend or linear
method) say why and keep the loop."""

from __future__ import annotations

import pytest
from engine_helpers import compare_steps, swapped
from test_decoder_stack import CONFIGS, _checkpoint

from tests.gguf_helpers import mixed_types, write_llama_gguf
from tritonlm import gguf_checkpoint
from tritonlm.config import EngineConfig
from tritonlm.worker import cpu_kernels
from tritonlm.worker.model_paths.layers_call import LayersCall
from tritonlm.worker.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason=f"{cpu_kernels.unavailable()}")


def _runner(model_dir, dtype: str, attention_backend: str = "cpu_paged", **settings) -> ModelRunner:
    return ModelRunner(
        EngineConfig(
            str(model_dir), dtype=dtype, attention_backend=attention_backend, max_num_seqs=4,
            max_num_batched_tokens=48, block_size=8, **settings,
        )
    )  # fmt: skip


def _compare_with_the_loop(runner, monkeypatch) -> list[int]:
    """`compare_steps` of the one call: each step that takes it against the Python loop, bitwise."""
    stack = runner.fast_path
    assert stack.layers_call is not None, stack.layers_call_refused
    calls = [0, 0]  # made, and made by the steps compared so far
    original = LayersCall.__call__

    def counted(self, *args):
        calls[0] += 1
        return original(self, *args)

    monkeypatch.setattr(LayersCall, "__call__", counted)

    def took(work) -> bool:
        new, calls[1] = calls[0] > calls[1], calls[0]
        return new

    return compare_steps(runner, took, lambda: swapped(stack, "layers_call", None))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_the_call_gives_the_loops_logits(tmp_path, monkeypatch, family, dtype):
    runner = _runner(_checkpoint(CONFIGS[family], tmp_path), dtype)
    compared = _compare_with_the_loop(runner, monkeypatch)
    assert min(compared) <= 2 < max(compared)  # gemv's rows, and oneDNN's past them


def test_the_call_gives_the_loops_logits_on_quantized_weights(model_dir, tmp_path, monkeypatch):
    int4 = _runner(model_dir, "bfloat16", quantization="int4")
    assert 1 in _compare_with_the_loop(int4, monkeypatch)
    file = write_llama_gguf(model_dir, tmp_path / "tiny-mixed.gguf", mixed_types)
    gguf = _runner(gguf_checkpoint.prepare(file, tmp_path / "written"), "bfloat16")
    call = gguf.fast_path.layers_call
    assert set(call.few.kinds) == {0, 1, 2} and call.many is None  # dense, int4 and GGUF blocks
    assert "tile by tile" in call.many_refused
    assert 1 in _compare_with_the_loop(gguf, monkeypatch)


def test_only_steps_whose_every_row_is_kept_take_it(model_dir):
    call = _runner(model_dir, "bfloat16").fast_path.layers_call
    assert call.runs(1, [0]) and call.runs(2, [0, 1]) and call.runs(3, [0, 1, 2])  # 3: oneDNN's GEMM
    assert set(call.few.kinds) == {0} and set(call.many.kinds) == {3}
    assert not call.runs(2, [1])  # a prefill chunk keeps only its last row


@pytest.mark.parametrize(
    ("family", "settings", "why"),
    [
        ("qwen3", {}, "norm each query and key head"),
        ("granite", {}, "scale their residual"),
        ("llama", {"kv_cache_dtype": "int8"}, "cache in the model's dtype"),
        ("llama", {"attention_backend": "sdpa"}, "not cpu_paged"),
        ("llama", {"quantization": "int8"}, "'int8' linear method, which it does not call"),
    ],
)
def test_other_layers_keep_the_loop_saying_why(tmp_path, family, settings, why):
    backend = settings.pop("attention_backend", "cpu_paged")
    runner = _runner(_checkpoint(CONFIGS[family], tmp_path), "bfloat16", backend, **settings)
    assert runner.fast_path.layers_call is None
    assert why in runner.fast_path.layers_call_refused
