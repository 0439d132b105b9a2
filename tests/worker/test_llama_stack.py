"""The Llama stack (tritonlm/worker/model_paths/llama_stack.py): a step without LoRA adapters goes through it,
and its logits are those of transformers' modules bitwise, in both dtypes, on every attention
backend, over steps that mix prefill chunks, decodes and prompt logits; a model that is not
exactly Llama's (tests/engine/test_engine.py's Qwen2 and GPT-2), a runner without fused projections and a
CPU without the kernels keep transformers' path, and so does a step with a LoRA adapter (whose
hooks sit on the projection modules: tests/engine/test_lora.py compares its tokens with a merged model)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import request, run_all

from tritonlm.config import EngineConfig
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import cpu_kernels
from tritonlm.worker.model_paths.llama_stack import LlamaStack
from tritonlm.worker.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason=f"{cpu_kernels.unavailable()}")


def _runner(model_dir, dtype: str, attention_backend: str, **settings) -> ModelRunner:
    return ModelRunner(
        EngineConfig(
            str(model_dir),
            dtype=dtype,
            attention_backend=attention_backend,
            max_num_seqs=6,
            max_num_batched_tokens=48,
            block_size=8,
            **settings,
        )
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_step_through_the_stack_gives_the_module_paths_logits(model_dir, dtype, attention_backend):
    runner = _runner(model_dir, dtype, attention_backend)
    assert isinstance(runner.fast_path, LlamaStack)
    stack, execute = runner.fast_path, runner.execute
    compared = []

    def both_paths(work):
        # A step run twice writes the same keys and values: the second run sees the first's cache.
        runner.fast_path = None
        reference = execute(work)
        runner.fast_path = stack
        out = execute(work)
        assert torch.equal(out.logits, reference.logits)
        assert out.all_logits.keys() == reference.all_logits.keys()
        assert all(torch.equal(out.all_logits[i], reference.all_logits[i]) for i in out.all_logits)
        compared.append((sum(work.num_new), len(work)))
        return out

    runner.execute = both_paths
    prompts = [list(range(10, 80)), [5, 6, 7], list(range(100, 130)), [9] * 20]
    requests = [request(p, 12, SamplingParams()) for p in prompts]
    requests.append(request(list(range(40, 66)), 4, SamplingParams(return_context_logits=True)))
    run_all(runner, requests, stagger=True)
    assert any(tokens > seqs for tokens, seqs in compared)  # prefill chunks beside decodes
    assert any(tokens == seqs for tokens, seqs in compared)  # decode-only steps


def test_the_stack_is_for_fused_llama_models_where_the_kernels_run(model_dir, monkeypatch):
    assert _runner(model_dir, "float32", "sdpa", fuse_projections=False).fast_path is None
    monkeypatch.setattr(cpu_kernels, "unavailable", lambda: "this CPU has no AVX-512F")
    assert _runner(model_dir, "float32", "sdpa").fast_path is None
