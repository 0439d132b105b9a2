"""What the `sdpa` backend computes beyond causal softmax attention (a layer's sliding window,
soft-capped logits, attention sinks): greedy tokens through the engine equal transformers `generate`
on random 2-layer checkpoints of each family that needs them, with prompts longer than the window,
outputs running past it, staggered requests, chunked prefill, a prefix-cache hit and preemption;
and the backend choice: `auto` takes a backend that computes what the checkpoint needs, a backend
named that does not is refused at start naming the feature and the one that does."""

from __future__ import annotations

import copy
from pathlib import Path

import family_helpers
import pytest
import torch
from engine_helpers import fp32_runner, request, run_all
from test_attention_backends import BLOCK, CPU, DIM, HEADS, KV_HEADS, Layer, step
from test_bfloat16 import NEAR_TIE
from transformers.models.gemma2 import modeling_gemma2
from transformers.models.gpt_oss import modeling_gpt_oss

from tritonlm.config import EngineConfig
from tritonlm.platforms.cpu import cpu_has_native_bf16
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import attention, cpu_kernels
from tritonlm.worker.attention.sdpa_metadata import sees
from tritonlm.worker.model_runner import ModelRunner

WINDOW = family_helpers.WINDOW
FAMILIES = family_helpers.WINDOWED_FAMILIES
MAX_SEQ_LEN = 64
# Six prompts past the window; the last two share a 16-token prefix with the first (prefix cache).
PREFIX = 16


def checkpoint(family: str, path: Path, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Path]:
    return family_helpers.random_checkpoint(copy.deepcopy(FAMILIES[family]), path, dtype), path


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    made = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (21, 12, 30, 17)]
    return made + [made[0][:PREFIX] + [7, 9, 11], made[0][:PREFIX] + [5] * 10]


def generate(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=None)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("speculative", ["", "[ngram]"], ids=["one token", "k tokens"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_past_the_window_equals_transformers_generate(tmp_path, family, speculative):
    model, path = checkpoint(family, tmp_path)
    asked = prompts()
    news = [MAX_SEQ_LEN - len(p) for p in asked]
    refs = [generate(model, p, n) for p, n in zip(asked, news, strict=True)]
    # Chunks of 16 tokens beside decodes, blocks of 4 positions, a cache of two whole sequences;
    # with `[ngram]`, decodes that verify proposals (several query rows a sequence).
    runner = fp32_runner(
        path, "auto", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4, max_num_batched_tokens=16, block_size=4,
        kv_cache_blocks=2 * MAX_SEQ_LEN // 4, speculative_model=speculative,
    )  # fmt: skip
    assert runner.attention.name == "sdpa"
    requests = [request(p, n, SamplingParams()) for p, n in zip(asked, news, strict=True)]
    engine, seqs = run_all(runner, requests, stagger=True)
    assert [s.output_ids for s in seqs] == refs
    stats = engine.stats()
    assert stats["prefix_cache_hits"] > 0, stats
    # Mistral's every layer has the window: blocks behind it are released and the cache holds all
    # four (tests/engine/test_window_generate.py preempts); the others have a global layer.
    assert stats["preemptions"] > 0 or runner.kv_window == WINDOW, stats
    assert bool(stats["spec_proposed_tokens"]) == bool(speculative)


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bfloat16")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bfloat16_greedy_past_the_window_matches_transformers_up_to_a_near_tie(tmp_path, family):
    """test_bfloat16.py's rule: bf16 runs may part where the two best logits are nearly tied."""
    model, path = checkpoint(family, tmp_path, torch.bfloat16)
    asked = prompts()
    refs = []
    with torch.no_grad():
        for p in asked:
            out = model.generate(
                torch.tensor([p]), max_new_tokens=MAX_SEQ_LEN - len(p), do_sample=False, eos_token_id=None,
                output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
            gaps = [float(step[0].float().topk(2).values.diff().abs()) for step in out.logits]
            clear = next((i for i, gap in enumerate(gaps) if gap < NEAR_TIE), len(gaps))
            refs.append((out.sequences[0, len(p) :].tolist(), clear))
    config = EngineConfig(str(path), dtype="bfloat16", max_seq_len=MAX_SEQ_LEN, max_num_seqs=4,
                          max_num_batched_tokens=16, block_size=4)  # fmt: skip
    runner = ModelRunner(config)
    assert runner.dtype == torch.bfloat16 and runner.attention.name == "sdpa"
    requests = [request(p, MAX_SEQ_LEN - len(p), SamplingParams()) for p in asked]
    _, seqs = run_all(runner, requests, stagger=True)
    compared = 0
    for seq, (tokens, clear) in zip(seqs, refs, strict=True):
        assert seq.output_ids[:clear] == tokens[:clear]
        compared += clear
    assert compared >= 4 * WINDOW  # every prompt is past the window: not vacuous


class Attention(torch.nn.Module):
    """What transformers' eager attention functions read of their module."""

    num_key_value_groups, head_dim, layer_idx = HEADS // KV_HEADS, DIM, 0

    def __init__(self, sinks: torch.Tensor) -> None:
        super().__init__()
        self.sinks = torch.nn.Parameter(sinks)


RULES = {  # transformers' eager attention of the family, what its layers hand ours
    "gpt-oss sinks": (modeling_gpt_oss.eager_attention_forward, {"sliding_window": 6}),
    "gemma 2 soft-capping": (modeling_gemma2.eager_attention_forward, {"sliding_window": 6, "softcap": 1.5}),
}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(("workspace", "fold_gqa"), [(True, False), (True, True), (False, False)])
def test_a_ruled_layer_equals_transformers_eager_attention(rule, workspace, fold_gqa):
    """Prefill chunks, a chunk after a cached prefix and decodes of different lengths, read in the
    decode workspace or gathered from the blocks, GQA folded or not: as transformers' own eager
    attention of the family over the whole sequence, with its sliding-window mask."""
    eager, handed = RULES[rule]
    module = Attention(torch.randn(HEADS))
    if "sliding_window" in handed and rule.startswith("gpt-oss"):
        handed = {**handed, "s_aux": module.sinks}
    b = attention.backend_class("sdpa")(BLOCK, torch.float32, CPU)
    q, k = torch.randn(1, HEADS, 2, DIM), torch.randn(1, KV_HEADS, 2, DIM)
    shapes = b.probe_shapes(lambda: b.attend(Layer(), q, k, k, None, **handed))
    b.allocate(16, shapes, max_num_seqs=4, max_seq_len=64)
    if not workspace:
        b.workspace = None
    if fold_gqa:
        b.on_fused_projections()
    keys = [torch.empty(0, KV_HEADS, DIM), torch.empty(0, KV_HEADS, DIM)]
    # (block table, cached, new) of both sequences per step: two prompts, a decode beside a later
    # chunk, then two decodes of different lengths.
    for seqs in [
        [([0, 1, 2], 0, 9), ([3, 4, 5], 0, 10)],
        [([0, 1, 2], 9, 1), ([3, 4, 5, 6], 10, 5)],
        [([0, 1, 2], 10, 1), ([3, 4, 5, 6], 15, 1)],
    ]:
        new = [torch.randn(n, KV_HEADS, DIM) for _, _, n in seqs]
        query = torch.randn(1, HEADS, sum(n for _, _, n in seqs), DIM)
        out = step(b, seqs, torch.cat(new), query, handed)
        offset = 0
        for i, (_, cached, n) in enumerate(seqs):
            keys[i] = torch.cat([keys[i], new[i]])
            seen = sees(
                torch.arange(cached, cached + n)[:, None], torch.arange(cached + n), handed["sliding_window"]
            )
            mask = torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))[None, None]
            k = keys[i].transpose(0, 1)[None]
            kwargs = {"softcap": handed["softcap"]} if "softcap" in handed else {}
            expected, _ = eager(
                module, query[:, :, offset : offset + n], k, 2 * k, mask, scaling=0.5, **kwargs
            )
            torch.testing.assert_close(out[offset : offset + n], expected[0])
            offset += n


@pytest.mark.skipif(cpu_kernels.unavailable() is not None, reason="cpu_paged does not run here")
def test_auto_takes_sdpa_for_a_window_saying_why(tmp_path, caplog):
    _, path = checkpoint("mistral", tmp_path)
    with caplog.at_level("INFO", logger="tritonlm.worker.attention"):
        runner = fp32_runner(path, "auto", max_seq_len=MAX_SEQ_LEN)
    assert runner.attention.name == "sdpa"
    assert (
        "attention_backend auto: sdpa, not cpu_paged (it does not compute sliding-window attention"
        in caplog.text
    )
    plain = fp32_runner(path, "auto", max_seq_len=WINDOW)  # no window binds: the kernel serves it
    assert plain.attention.name == "cpu_paged"
