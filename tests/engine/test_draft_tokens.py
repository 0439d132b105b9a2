"""Draft tokens (`draft_input_ids`, `draft_logits`, `draft_acceptance_threshold`): verified in one
step, up to K + 1 tokens from it; greedy output equals the output without drafts whatever they are;
the sampled acceptance rule keeps the target's distribution; through tritonserver, streaming one
response per accepted run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from client.stream import StreamClient
from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.sequence import Sequence
from tritonlm.errors import InvalidRequest
from tritonlm.sampling.acceptance import verify
from tritonlm.sampling.params import SamplerInput, SamplingParams
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.worker.model_runner import ModelRunner

VOCAB = 4096
PROMPT = [5, 77, 300, 1200, 9, 41, 2000, 13, 8, 900, 31, 7, 600, 45, 3001, 17, 22]


@pytest.fixture(scope="module")
def runner(model_dir) -> ModelRunner:
    return ModelRunner(EngineConfig(str(model_dir), dtype="float32", max_num_seqs=4, max_seq_len=128))


def tensors(new: int, drafts: list[int] | None = None, prompt=PROMPT, **extra) -> dict:
    values = {
        "input_ids": np.array([prompt], np.int32),
        "request_output_len": np.array([[new]], np.int32),
        **{k: np.asarray(v) for k, v in extra.items()},
    }
    if drafts is not None:
        values["draft_input_ids"] = np.array(drafts, np.int32)
    return values


def run(runner: ModelRunner, requests: list[dict]) -> tuple[list[Sequence], list[list[int]]]:
    """Runs requests to the end; returns them and, per request, the token counts it reported."""
    runs: dict[int, list[int]] = {}
    engine = Engine(runner, lambda seq, n: runs.setdefault(seq.key, []).append(n))
    seqs = [engine.add(parse_request(t, VOCAB, 128)) for t in requests]
    while engine.scheduler.has_work():
        engine.step()
    assert engine.stats()["kv_blocks_used"] == 0
    return seqs, [runs[s.key] for s in seqs]


@pytest.fixture(scope="module")
def greedy(runner) -> list[int]:
    (seq,), _ = run(runner, [tensors(16)])
    return seq.output_ids


def test_drafts_right_wrong_or_partly_right_give_the_greedy_output(runner, greedy):
    right = greedy[:5]
    wrong = [(t + 1) % VOCAB for t in greedy[:5]]
    partly = [*greedy[:3], (greedy[3] + 1) % VOCAB, greedy[4]]
    seqs, runs = run(runner, [tensors(16, d) for d in (right, wrong, partly)])
    assert [s.output_ids for s in seqs] == [greedy] * 3
    assert runs[0][0] == 6  # 5 accepted drafts and the token after them, from one step
    assert runs[1][0] == 1 and runs[2][0] == 4
    assert all(len(s.out.timings) == 16 for s in seqs)  # timings stay per token
    assert seqs[0].out.timings[1].decode_ms == 0.0  # arrived with the first


def test_drafts_with_chunked_prefill_stop_words_and_max_tokens(model_dir, runner, greedy):
    small = ModelRunner(
        EngineConfig(
            str(model_dir), dtype="float32", max_num_seqs=4, max_seq_len=128, max_num_batched_tokens=8
        )
    )
    (seq,), runs = run(small, [tensors(16, greedy[:4])])  # the prompt is fed in chunks of 8
    assert seq.output_ids == greedy
    (short,), runs = run(runner, [tensors(3, greedy[:6])])  # more drafts than tokens left
    assert short.output_ids == greedy[:3] and runs == [[3]]
    stop = [[greedy[2]], [1]]  # a one-token stop word among the accepted drafts
    (stopped,), _ = run(runner, [tensors(16, greedy[:6], stop_words_list=np.array(stop, np.int32))])
    assert stopped.output_ids == greedy[:3] and stopped.out.finish_reason == "stop_words"


def test_logits_processors_see_each_rows_own_prefix(runner):
    settings = {"no_repeat_ngram_size": [2], "repetition_penalty": [1.3], "min_length": [6]}
    (plain,), _ = run(runner, [tensors(14, **settings)])
    drafts = plain.output_ids[:8]
    (drafted,), runs = run(runner, [tensors(14, drafts, **settings)])
    assert drafted.output_ids == plain.output_ids and runs[0][0] == 9


def test_sampled_drafts_with_seeds_are_valid_and_logits_need_the_right_shape(runner, greedy):
    sampled = {"runtime_top_p": [1.0], "random_seed": np.array([3], np.uint64)}
    logits = np.zeros((4, VOCAB), np.float32)
    (seq,), _ = run(runner, [tensors(10, greedy[:4], draft_logits=logits, **sampled)])
    assert len(seq.output_ids) == 10
    for extra, name in (
        ({"draft_logits": np.zeros((3, VOCAB), np.float32)}, "draft_logits"),
        ({"draft_acceptance_threshold": [0.5]}, "draft_acceptance_threshold"),  # needs draft_logits
        ({"draft_logits": logits, "draft_acceptance_threshold": [1.5]}, "draft_acceptance_threshold"),
        ({"beam_width": [2]}, "draft_input_ids"),
    ):
        with pytest.raises(InvalidRequest, match=name):
            parse_request(tensors(10, greedy[:4], **extra), VOCAB, 128)
    with pytest.raises(InvalidRequest, match="draft_input_ids"):
        parse_request(tensors(10, [VOCAB]), VOCAB, 128)


def _first_tokens(
    p: torch.Tensor, q: torch.Tensor | None, proposal: int, trials: int, seed: int
) -> np.ndarray:
    """How often `verify` emits each token first, for one proposal drawn from q (or fixed); each
    trial is another request (a key's draw at a position is fixed)."""
    gen = torch.Generator().manual_seed(seed)
    rows = p.log()[None].repeat(2, 1)
    counts = np.zeros(p.shape[0])
    for trial in range(trials):
        s = SamplerInput(SamplingParams(temperature=1.0, top_p=1.0), (1,), [], seed * trials + trial)
        x = int(torch.multinomial(q, 1, generator=gen)) if q is not None else proposal
        token = verify(rows, [s, s], [x], q[None] if q is not None else None)[0]
        counts[token] += 1
    return counts / trials


def test_sampled_acceptance_rule_keeps_the_target_distribution():
    p = torch.tensor([0.5, 0.25, 0.15, 0.1])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # a poor drafter
    freq = _first_tokens(p, q, 0, 4000, seed=0)
    np.testing.assert_allclose(freq, p.numpy(), atol=0.03)
    freq = _first_tokens(p, None, 2, 4000, seed=1)  # ids only: draw and compare
    np.testing.assert_allclose(freq, p.numpy(), atol=0.03)
    # A threshold replaces the draw: accepted exactly when p(x) >= threshold * q(x).
    s = SamplerInput(SamplingParams(temperature=1.0, top_p=1.0), (1,), [], 0)
    rows = p.log()[None].repeat(2, 1)
    assert verify(rows, [s, s], [3], q[None], threshold=0.2)[0] == 3  # 0.1 >= 0.2 * 0.4
    assert verify(rows, [s, s], [3], q[None], threshold=0.3)[0] != 3
    greedy = SamplerInput(SamplingParams(), (1,), [], None)
    assert verify(rows, [greedy, greedy], [1], q[None]) == [0]  # greedy: only the argmax


def test_draft_tokens_through_tritonserver(servers, greedy):
    client = StreamClient(servers.grpc_url)
    try:
        base = {"input_ids": PROMPT, "request_output_len": 16, "streaming": True}
        for drafts, first_run in ((greedy[:5], 6), ([1, 2, 3, 4], 1), ([*greedy[:2], 9, 9], 3)):
            responses = list(client.generate("engine", {**base, "draft_input_ids": drafts}))
            tokens = np.concatenate([r["output_ids"].reshape(-1) for r in responses]).tolist()
            # A step's later tokens take no time of their own (decode_ms 0): the first step's run,
            # whatever responses the sender coalesced the steps into.
            decode_ms = np.concatenate([r["decode_ms"].reshape(-1) for r in responses])
            first_step = 1 + next((i for i, ms in enumerate(decode_ms[1:]) if ms > 0), len(decode_ms) - 1)
            assert tokens == greedy and first_step == first_run
            assert sum(r["batch_size"].size for r in responses) == 16  # per token
        text = {"text_input": ["Hello"], "max_tokens": 6, "draft_input_ids": [1, 2]}
        (response,) = list(client.generate("ensemble", text))
        assert response["output_ids"].shape == (1, 6)
    finally:
        client.close()
