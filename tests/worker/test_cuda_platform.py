"""The engine on the CUDA platform: a small random Llama's greedy tokens through the engine (the
platform's attention backend, host tensors copied up without blocking) equal transformers
`generate` on the same GPU. Skipped, naming CUDA, where torch sees none; self-contained (no session
fixtures), so it runs on a GPU machine with `pytest --noconftest`."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import fp32_runner, request, run_all
from transformers import LlamaConfig, LlamaForCausalLM

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


def test_greedy_on_cuda_equals_transformers_generate(llama_dir):
    runner = fp32_runner(
        llama_dir, "auto", device="cuda", max_num_seqs=4, max_seq_len=128, kv_cache_blocks=64
    )
    assert runner.platform.name == "cuda" and runner.device.type == "cuda"
    assert runner.fast_path is None  # no fast path is registered for CUDA yet
    model = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).to("cuda").eval()
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
