"""The engine on the CUDA platform: a small random Llama's greedy tokens through the engine (the
platform's attention backend, host tensors copied up without blocking), with and without decode
graphs (`decode_graphs`, on by default there: CUDA graphs over sdpa's static step), equal
transformers `generate` on the same GPU; each graph's logits equal the eager step's; a greedy
decode step synchronises with the GPU once (its tokens' copy back); a mixture-of-experts model,
graphs or not (a capture its routing refuses leaves them off), gives generate's tokens too.
Skipped, naming CUDA, where torch sees none; self-contained (no session fixtures), so it runs on a
GPU machine with `pytest --noconftest`."""

from __future__ import annotations

import warnings

import pytest
import torch
from engine_helpers import compare_graph_steps, fp32_runner, request, run_all
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig

from tritonlm.engine.loop import Engine
from tritonlm.platforms.cuda import CudaPlatform
from tritonlm.sampling.params import SamplingParams

NO_CUDA = CudaPlatform.unavailable()
pytestmark = pytest.mark.skipif(NO_CUDA is not None, reason=f"needs CUDA: {NO_CUDA}")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("llama-cuda")
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def _greedy_equals_generate(runner, model) -> None:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (5, 19, 33, 8, 60, 2)]
    with torch.no_grad():
        refs = [
            model.generate(
                torch.tensor([p], device="cuda"), max_new_tokens=16, do_sample=False, eos_token_id=None
            )[0, len(p) :].tolist()
            for p in prompts
        ]
    _, seqs = run_all(runner, [request(p, 16, SamplingParams()) for p in prompts], stagger=True)
    assert [s.output_ids for s in seqs] == refs


def _runner(llama_dir, decode_graphs: bool | None):
    return fp32_runner(
        llama_dir, "auto", device="cuda", max_num_seqs=4, max_seq_len=128, kv_cache_blocks=64,
        decode_graphs=decode_graphs,
    )  # fmt: skip


@pytest.mark.parametrize("decode_graphs", [False, True])
def test_greedy_on_cuda_equals_transformers_generate(llama_dir, decode_graphs):
    runner = _runner(llama_dir, decode_graphs)
    assert runner.platform.name == "cuda" and runner.device.type == "cuda"
    assert runner.fast_path is None  # no fast path is registered for CUDA yet
    model = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).to("cuda").eval()
    _greedy_equals_generate(runner, model)


def test_decode_graphs_are_on_by_default_on_cuda(llama_dir):
    assert _runner(llama_dir, decode_graphs=None).decode_graphs is not None


def test_decode_graphs_give_the_eager_steps_logits(llama_dir):
    runner = _runner(llama_dir, decode_graphs=True)
    assert runner.attention.name == "sdpa" and runner.decode_graphs.sizes == [1, 2, 4]
    compared = compare_graph_steps(runner, atol=1e-4)
    assert 3 in compared  # padded to 4 (a fast GPU may admit all three before the first decode)


def test_a_greedy_decode_step_synchronises_once(llama_dir):
    engine = Engine(_runner(llama_dir, decode_graphs=True), lambda seq, n: None)
    seqs = [engine.add(request(p, 8, SamplingParams())) for p in ([5, 6, 7], [9, 10, 11, 12])]
    while any(len(s.output_ids) < 2 for s in seqs):  # the prefill, then a decode step
        engine.step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")  # a warning at each synchronising call
        try:
            engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) == 1, syncs
    assert all(len(s.output_ids) == 3 for s in seqs)


def test_a_mixture_of_experts_model_gives_generates_tokens(tmp_path):
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(tmp_path)
    runner = _runner(tmp_path, decode_graphs=None)
    _greedy_equals_generate(runner, model.to("cuda").eval())
