"""A Mistral checkpoint whose every layer has a sliding window of W: the engine releases the blocks
behind it, and greedy tokens of sequences of 8·W tokens still equal transformers `generate` token
for token, under concurrency, chunked prefill, preemption and proposals, while no decoding sequence
holds more than ceil(W / block) + 1 blocks (what each step's block tables show the worker); beams
forked from a sequence past its window equal `generate(num_beams=…)`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import fp32_runner, generate_beams, request, run_all
from transformers import AutoModelForCausalLM, MistralConfig

from tritonlm.sampling.params import SamplingParams
from tritonlm.step import ModelOutput, StepBatch
from tritonlm.worker.model_runner import ModelRunner

W, BLOCK = 16, 4
MAX_SEQ_LEN = 8 * W + 8
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=256,
              sliding_window=W)  # fmt: skip


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    """A random checkpoint whose tokens depend on attention (weights larger than transformers' own
    initialisation, as test_attention_features.py's)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(MistralConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "norm" not in name:
                weight.normal_(0, 0.1 if "embed" in name else 0.3)
    model.config.architectures = [type(model).__name__]
    path = tmp_path_factory.mktemp("mistral_window")
    model.save_pretrained(path)
    return model, path


def watch_blocks(runner: ModelRunner) -> list[int]:
    """Records, per step, the most blocks any decoding sequence's table holds (released entries
    name the null block, `kv_cache_blocks`)."""
    most: list[int] = []
    null, execute = runner.config.kv_cache_blocks, runner.execute

    def watched(step: StepBatch) -> ModelOutput:
        decoding = [t for t, n in zip(step.block_tables, step.num_new, strict=True) if n == 1]
        most.append(max((sum(b != null for b in t) for t in decoding), default=0))
        return execute(step)

    runner.execute = watched
    return most


def prompts() -> list[list[int]]:
    """Eight prompts, the second starting with the first's W tokens (a prefix hit)."""
    gen = torch.Generator().manual_seed(1)
    made = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (20, 37, 9, 50, 24, 31, 12, 40)]
    made.insert(1, made[0][:W] + [7, 9])
    return made


def greedy_choices(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[int]:
    """transformers' greedy choice after the prompt and each of `tokens` (one forward over them all,
    with the model's own sliding-window mask): equal to `tokens` exactly when `generate` would make
    them, at a fraction of its cost."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :]
    return logits.argmax(-1).tolist()


@pytest.mark.parametrize(
    "speculative, max_num_seqs, workspace",
    [("", 4, True), ("", 4, False), ("", 8, True), ("[ngram]", 4, True)],
    ids=["4 running", "gathered", "8: preempted", "k tokens"],
)
def test_eight_windows_of_greedy_tokens_equal_generate_in_bounded_blocks(
    mistral, speculative, max_num_seqs, workspace
):
    model, path = mistral
    asked = prompts()[: max_num_seqs + 1]
    # The smallest cache allowed (one whole sequence): 8 sequences of ~5 blocks each overflow it.
    runner = fp32_runner(
        path, "sdpa", max_seq_len=MAX_SEQ_LEN, max_num_seqs=max_num_seqs, max_num_batched_tokens=16,
        block_size=BLOCK, kv_cache_blocks=MAX_SEQ_LEN // BLOCK, speculative_model=speculative,
    )  # fmt: skip
    assert runner.kv_window == W
    if not workspace:  # the decodes gather their blocks, as on a GPU
        runner.attention.workspace = None
    most = watch_blocks(runner)
    requests = [request(p, MAX_SEQ_LEN - len(p), SamplingParams()) for p in asked]
    # Eight at once overflow the cache whatever the timing; staggered, whether they do depends on it.
    engine, seqs = run_all(runner, requests, stagger=max_num_seqs != 8)
    for seq in seqs:  # every sequence reaches 8·W tokens
        assert seq.num_tokens == MAX_SEQ_LEN
        assert seq.output_ids == greedy_choices(model, list(seq.prompt_ids), seq.output_ids)
    if max_num_seqs == 4 and workspace:  # and `generate` itself, once
        first = seqs[0]
        with torch.no_grad():
            out = model.generate(
                torch.tensor([first.prompt_ids]), max_new_tokens=len(first.output_ids), do_sample=False,
                eos_token_id=None,
            )  # fmt: skip
        assert first.output_ids == out[0, len(first.prompt_ids) :].tolist()
    assert max(most) == -(-W // BLOCK) + 1
    stats = engine.stats()
    assert stats["prefix_cache_hits"] > 0, stats
    assert (stats["preemptions"] > 0) == (max_num_seqs == 8), stats
    assert bool(stats["spec_proposed_tokens"]) == bool(speculative)


def test_beams_forked_past_the_window_equal_generate(mistral):
    model, path = mistral
    prompt = torch.randint(3, 256, (3 * W,), generator=torch.Generator().manual_seed(2)).tolist()
    width, new = 3, 2 * W
    expected = generate_beams(model, prompt, width, new)
    runner = fp32_runner(
        path, "sdpa", max_seq_len=MAX_SEQ_LEN, block_size=BLOCK, max_num_seqs=4, max_num_batched_tokens=16
    )
    most = watch_blocks(runner)
    _, (seq,) = run_all(runner, [request(prompt, new, SamplingParams(end_id=0), beam_width=width)])
    assert [b.tokens for b in seq.group.results] == expected
    assert max(most) == -(-W // BLOCK) + 1
