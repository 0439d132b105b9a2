"""The families served without an attention feature of their own (those are
test_attention_features.py's, Qwen3-Next test_recurrent_state.py's): greedy tokens through the
engine equal transformers `generate`, on random 2-layer checkpoints of each family's real config
class, fp32, `attention_backend` and `model_path` auto (so the decoder stack and grouped experts
where they apply), with staggered requests, prefill chunks of 16 beside decodes, a prefix-cache hit,
preemption, and k-token steps."""

from __future__ import annotations

import family_helpers
import pytest
import torch
from engine_helpers import fp32_runner, request, run_all

from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import cpu_kernels

FAMILIES = family_helpers.FAMILIES
STACKED = {"qwen2", "qwen3", "phi-3", "granite"}  # on the decoder stack where our kernels run
NO_KERNELS = cpu_kernels.unavailable()
MAX_SEQ_LEN = 64
PREFIX = 16  # the last two prompts share the first's first 16 tokens: a prefix-cache hit


def checkpoint(family: str, path):
    return family_helpers.random_checkpoint(FAMILIES[family](), path)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    made = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (21, 12, 30, 17)]
    return made + [made[0][:PREFIX] + [7, 9, 11], made[0][:PREFIX] + [5] * 10]


@pytest.mark.parametrize("speculative", ["", "[ngram]"], ids=["one token", "k tokens"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_transformers_generate(tmp_path, family, speculative):
    model = checkpoint(family, tmp_path)
    asked = prompts()
    news = [MAX_SEQ_LEN - len(p) for p in asked]
    with torch.no_grad():
        refs = [
            model.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False, eos_token_id=None)[
                0, len(p) :
            ].tolist()
            for p, n in zip(asked, news, strict=True)
        ]
    # Blocks of 4 positions, a cache of two whole sequences for four running: preemption.
    runner = fp32_runner(
        tmp_path, "auto", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4, max_num_batched_tokens=16, block_size=4,
        kv_cache_blocks=2 * MAX_SEQ_LEN // 4, speculative_model=speculative,
    )  # fmt: skip
    if family in STACKED and NO_KERNELS is None:  # the fast path is what these tokens come from
        assert runner.fast_path is not None and runner.fast_path.name == "decoder_stack"
    requests = [request(p, n, SamplingParams()) for p, n in zip(asked, news, strict=True)]
    engine, seqs = run_all(runner, requests, stagger=True)
    assert [s.output_ids for s in seqs] == refs
    stats = engine.stats()
    assert stats["prefix_cache_hits"] > 0 and stats["preemptions"] > 0, stats
    assert bool(stats["spec_proposed_tokens"]) == bool(speculative)
