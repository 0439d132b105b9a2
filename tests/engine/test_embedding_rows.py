"""Prompt positions fed a row of input embeddings instead of a token id (`Request.prompt_embeds`):
the same results as the ids those rows embed, prefix-cache keys by content, chunked prefill,
preemption."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import fp32_runner, request
from transformers import AutoModelForCausalLM

from tritonlm.engine.loop import Engine
from tritonlm.engine.request import PromptEmbeds, Request, content_key
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker.model_runner import ModelRunner

PLACEHOLDER = 3


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def table(hf_model) -> torch.Tensor:
    return hf_model.get_input_embeddings().weight.detach()


@pytest.fixture(scope="module")
def runner(attention_backend, model_dir) -> ModelRunner:
    return fp32_runner(model_dir, attention_backend, max_num_seqs=6, max_seq_len=128)


def with_rows(
    prompt: list[int], positions: list[int], rows: torch.Tensor, max_new: int = 12, **params: object
) -> Request:
    """`prompt` with placeholder ids at `positions`, which carry `rows` instead."""
    ids = [PLACEHOLDER if i in positions else t for i, t in enumerate(prompt)]
    embeds = PromptEmbeds.of(positions, rows)
    return request(ids, max_new, SamplingParams(**params), prompt_embeds=embeds)


def embedding_of(prompt: list[int], positions: list[int], table: torch.Tensor) -> torch.Tensor:
    return table[[prompt[p] for p in positions]].clone()


def run(engine: Engine, requests: list[Request]) -> list[Sequence]:
    seqs = [engine.add(req) for req in requests]
    while engine.scheduler.has_work():
        engine.step()
    assert engine.stats()["kv_blocks_used"] == 0
    return seqs


def generate(hf_model, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None
        )
    return out[0, len(prompt) :].tolist()


def random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(5, 4000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prompt_embeds_validate_and_key_rows_by_content():
    rows = torch.randn(2, 8)
    embeds = PromptEmbeds.of([4, 9], rows)
    assert embeds.keys == PromptEmbeds.of((4, 9), rows.clone()).keys
    assert embeds.keys[0] != embeds.keys[1] and embeds.keys[0] != content_key(rows[0].double())
    assert embeds.span(0, 4) == (0, 0) and embeds.span(4, 10) == (0, 2) and embeds.span(5, 10) == (1, 2)
    assert embeds.cache_tokens([1, 2, 3], 3) == [1, embeds.keys[0], 3]
    assert PromptEmbeds.of([1], torch.ones(1, 4, dtype=torch.bfloat16)).keys  # any float dtype
    for positions, bad in (([4], rows), ([9, 4], rows), ([-1, 4], rows), ([1, 2], rows.long())):
        with pytest.raises(ValueError):
            PromptEmbeds.of(positions, bad)


def test_rows_equal_to_token_embeddings_give_the_same_logits_and_output(runner, hf_model, table):
    prompt = random_tokens(40, 1)
    positions = [0, 3, 17, 18, 39]  # the first, inside blocks, across a block edge, the last
    params = {"return_context_logits": True, "return_generation_logits": True}
    plain = request(prompt, 12, SamplingParams(**params))
    rows = with_rows(prompt, positions, embedding_of(prompt, positions, table), **params)
    plain, rows = run(Engine(runner, lambda seq, n: None), [plain, rows])  # in the same steps
    assert rows.output_ids == plain.output_ids == generate(hf_model, prompt, 12)
    context = torch.cat(rows.out.prompt_logits)
    torch.testing.assert_close(context, torch.cat(plain.out.prompt_logits), atol=1e-5, rtol=0)
    generated = torch.stack(rows.out.generation_logits)
    # Two rows of one decode batch are not bitwise equal under the CPU matmul kernels (seen: 4e-5);
    # a wrong embedding row would differ by orders more.
    torch.testing.assert_close(generated, torch.stack(plain.out.generation_logits), atol=1e-4, rtol=0)


def test_same_rows_share_prefix_blocks_and_other_rows_do_not(attention_backend, model_dir, hf_model, table):
    runner = fp32_runner(model_dir, attention_backend, max_num_seqs=4, max_seq_len=128)
    engine = Engine(runner, lambda seq, n: None)
    system = random_tokens(40, 2)  # two full 16-token blocks, then part of a third
    positions = [5, 6, 7, 8, 20]  # rows in both full blocks
    other_tokens = random_tokens(40, 3)
    (first,) = run(engine, [with_rows(system + [11, 12], positions, embedding_of(system, positions, table))])
    same = with_rows(system + [21], positions, embedding_of(system, positions, table))
    other = with_rows(system + [21], positions, embedding_of(other_tokens, positions, table))
    bare = request([PLACEHOLDER if i in positions else t for i, t in enumerate(system)] + [21], 12)
    # One at a time, so only `first`'s blocks can be shared.
    same, other, bare = (run(engine, [req])[0] for req in (same, other, bare))
    assert first.out.cached_tokens == 0
    assert same.out.cached_tokens == 32
    assert other.out.cached_tokens == 0 and bare.out.cached_tokens == 0
    assert engine.stats()["prefix_cache_hits"] == 32

    substituted = list(system)
    for p in positions:
        substituted[p] = other_tokens[p]
    assert first.output_ids == generate(hf_model, system + [11, 12], 12)
    assert same.output_ids == generate(hf_model, system + [21], 12)
    assert other.output_ids == generate(hf_model, substituted + [21], 12)
    assert bare.output_ids == generate(hf_model, list(bare.prompt_ids), 12)


def test_chunked_prefill_across_embedding_positions(attention_backend, model_dir, hf_model, table):
    runner = fp32_runner(
        model_dir, attention_backend, max_num_seqs=4, max_num_batched_tokens=8, max_seq_len=96
    )
    prompt = random_tokens(30, 4)
    positions = [6, 7, 8, 15, 16, 29]  # chunks end at 8, 16, 24: rows on both sides of each
    rows = embedding_of(prompt, positions, table)
    (first,) = run(Engine(runner, lambda seq, n: None), [with_rows(prompt, positions, rows)])
    assert first.output_ids == generate(hf_model, prompt, 12)

    # A 17-token prompt ending in a row, its first block cached: the row is fed alone (a decode).
    short = prompt[:17]
    engine = Engine(runner, lambda seq, n: None)
    run(engine, [with_rows(short, [7, 16], embedding_of(short, [7, 16], table))])
    (again,) = run(engine, [with_rows(short, [7, 16], embedding_of(short, [7, 16], table))])
    assert again.out.cached_tokens == 16 and again.output_ids == generate(hf_model, short, 12)


def test_preemption_recomputes_embedding_rows(attention_backend, model_dir, hf_model, table):
    # 6 blocks of 16 tokens: room for about two of the eight sequences at a time.
    small = fp32_runner(model_dir, attention_backend, max_num_seqs=8, max_seq_len=96, kv_cache_blocks=6)
    gen = torch.Generator().manual_seed(5)
    lengths = torch.randint(10, 50, (8,), generator=gen).tolist()
    prompts = [random_tokens(n, 10 + i) for i, n in enumerate(lengths)]
    requests = []
    for i, prompt in enumerate(prompts):
        positions = sorted({i % len(prompt), len(prompt) // 2, len(prompt) - 1})
        requests.append(with_rows(prompt, positions, embedding_of(prompt, positions, table), max_new=20))
    engine = Engine(small, lambda seq, n: None)
    seqs = run(engine, requests)
    assert engine.stats()["preemptions"] > 0 and any(s.num_preemptions for s in seqs)
    assert [s.output_ids for s in seqs] == [generate(hf_model, p, 20) for p in prompts]
