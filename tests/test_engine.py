"""The engine without Triton: batching against transformers, sampling rules, request validation."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TypicalLogitsWarper,
)

from tritonlm import pbtxt
from tritonlm.engine import Engine
from tritonlm.errors import InvalidRequest
from tritonlm.model_runner import EngineSettings, ModelRunner
from tritonlm.request import parse_request
from tritonlm.sampling import SamplerInput, SamplingParams, _filter, sample
from tritonlm.sequence import Sequence


def test_config_pbtxt_matches_the_contract():
    assert pbtxt.stale() == []


@pytest.fixture(scope="module")
def runner(model_dir) -> ModelRunner:
    return ModelRunner(EngineSettings(str(model_dir), max_running_seqs=6, max_seq_len=256))


def run_all(runner: ModelRunner, seqs: list[Sequence], stagger: bool = False) -> None:
    """Runs the engine loop until every sequence finished; `stagger` admits them while others run."""
    done = threading.Semaphore(0)
    engine = Engine(runner, lambda seq, n: seq.finish_reason and done.release())
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    for i, seq in enumerate(seqs):
        engine.add(seq)
        if stagger and i % 3 == 2:
            done.acquire(timeout=60)  # add the next ones while the rest are mid-generation
            done.release()
    for _ in seqs:
        assert done.acquire(timeout=60)
    engine.stop()
    thread.join(10)
    assert engine.stats()["free_slots"] == runner.max_running_seqs


def test_batched_greedy_equals_transformers_generate(runner, model_dir):
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(5, 4000, (int(n),), generator=gen).tolist()
        for n in torch.randint(1, 60, (10,), generator=gen)
    ]
    seqs = [Sequence(p, 20, SamplingParams()) for p in prompts]
    run_all(runner, seqs, stagger=True)  # more requests than slots, joining mid-flight
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for seq, prompt in zip(seqs, prompts, strict=True):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None
            )
        assert seq.output_ids == ref[0, len(prompt) :].tolist()
        assert seq.finish_reason == "length"
        assert [t.batch_size for t in seq.timings] and len(seq.timings) == 20


def test_end_id_stop_words_and_min_length(runner):
    probe = Sequence([10, 11, 12], 12, SamplingParams())
    run_all(runner, [probe])
    out = probe.output_ids
    ended = Sequence([10, 11, 12], 12, SamplingParams(end_id=out[3]))
    stopped = Sequence([10, 11, 12], 12, SamplingParams(), stop_words=[out[2:4]])
    delayed = Sequence([10, 11, 12], 12, SamplingParams(end_id=out[0], min_length=5))
    run_all(runner, [ended, stopped, delayed])
    assert (ended.output_ids, ended.finish_reason) == (out[:4], "end_id")
    assert (stopped.output_ids, stopped.finish_reason) == (out[:4], "stop_words")
    assert len(delayed.output_ids) >= 5 and out[0] not in delayed.output_ids[:5]


def test_cancelled_sequence_leaves_within_a_step(runner):
    cancel = threading.Event()
    seq = Sequence([1, 2, 3], 200, SamplingParams(), is_cancelled=cancel.is_set)
    outputs = []

    def on_output(s: Sequence, n: int) -> None:
        outputs.append(len(s.output_ids))
        if len(s.output_ids) == 3:
            cancel.set()

    engine = Engine(runner, on_output)
    engine.add(seq)
    engine._admit()
    while not seq.finish_reason:
        engine.step()
    assert seq.finish_reason == "cancelled" and len(seq.output_ids) == 3
    assert engine.stats()["free_slots"] == runner.max_running_seqs


def sampler_input(params: SamplingParams, prompt=(1, 2, 3), output=(), seed=None) -> SamplerInput:
    params.seed = seed
    return SamplerInput(params, list(prompt), list(output), params.make_generator(torch.device("cpu")))


def test_greedy_rules():
    logits = torch.randn(3, 50)
    batch = [sampler_input(SamplingParams()), sampler_input(SamplingParams(temperature=0.0, top_p=0.9))]
    batch.append(sampler_input(SamplingParams(top_k=1, temperature=2.0)))
    assert all(s.params.greedy for s in batch)
    tokens, _ = sample(logits.clone(), batch)
    assert tokens == logits.argmax(-1).tolist()


def test_seeded_sampling_is_reproducible_and_row_independent():
    logits = torch.randn(4, 100)
    params = dict(temperature=0.8, top_p=0.95)
    alone, _ = sample(logits[:1].clone(), [sampler_input(SamplingParams(**params), seed=7)])
    batch = [sampler_input(SamplingParams(**params), seed=s) for s in (3, 7, 9, 11)]
    batch[0], batch[1] = batch[1], batch[0]
    together, _ = sample(torch.stack([logits[0], logits[1], logits[2], logits[3]]).clone(), batch)
    assert together[0] == alone[0]


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    batch = [sampler_input(SamplingParams(top_k=2, top_p=1.0)), sampler_input(SamplingParams(top_p=0.79))]
    kept = torch.isfinite(_filter(logits.clone(), batch))
    assert kept.tolist() == [[True, True, False, False], [True, True, False, False]]


def test_penalties_and_typical_p_match_transformers():
    logits = torch.randn(1, 64)
    tokens = [5, 9, 9, 30]
    params = SamplingParams(repetition_penalty=1.3, no_repeat_ngram_size=2)
    ids = torch.tensor([tokens])
    expected = NoRepeatNGramLogitsProcessor(2)(
        ids, RepetitionPenaltyLogitsProcessor(1.3)(ids, logits.clone())
    )
    got = logits.clone()
    from tritonlm.sampling import _apply_penalties, _banned_tokens

    s = sampler_input(params, prompt=tokens[:2], output=tokens[2:])
    _apply_penalties(got, [s])
    got[0, _banned_tokens(s)] = float("-inf")
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.allclose(got[torch.isfinite(got)], expected[torch.isfinite(expected)])

    warped = TypicalLogitsWarper(0.5)(ids, logits.clone())
    mine = _filter(logits.clone(), [sampler_input(SamplingParams(typical_p=0.5, top_p=1.0))])
    assert torch.equal(torch.isfinite(mine), torch.isfinite(warped))


def test_presence_and_frequency_penalties():
    logits = torch.zeros(1, 10)
    s = sampler_input(
        SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), prompt=[1], output=[3, 3, 4]
    )
    from tritonlm.sampling import _apply_penalties

    _apply_penalties(logits, [s])
    assert logits[0, 3].item() == pytest.approx(-1.0) and logits[0, 4].item() == pytest.approx(-0.75)
    assert logits[0, 1].item() == 0.0  # the prompt is not penalised (OpenAI's rule)


def test_log_probs_are_log_softmax_after_temperature():
    logits = torch.randn(1, 30)
    s = sampler_input(SamplingParams(temperature=0.5, top_k=5, return_log_probs=True), seed=1)
    tokens, log_probs = sample(logits.clone(), [s])
    assert log_probs[0] == pytest.approx((logits[0] / 0.5).log_softmax(-1)[tokens[0]].item(), abs=1e-5)


def tensors(**extra) -> dict[str, np.ndarray]:
    base = {"input_ids": np.array([[1, 2, 3]], np.int32), "request_output_len": np.array([[4]], np.int32)}
    return {**base, **{k: np.asarray(v) for k, v in extra.items()}}


@pytest.mark.parametrize(
    "extra, name",
    [
        ({"request_output_len": [[0]]}, "request_output_len"),
        ({"request_output_len": [[300]]}, "request_output_len"),
        ({"input_ids": [[1, 99999]]}, "input_ids"),
        ({"temperature": [-1.0]}, "temperature"),
        ({"runtime_top_p": [1.5]}, "runtime_top_p"),
        ({"typical_p": [0.0]}, "typical_p"),
        ({"repetition_penalty": [0.0]}, "repetition_penalty"),
        ({"beam_width": [2]}, "beam_width"),
        ({"len_penalty": [0.5]}, "len_penalty"),
        ({"lora_task_id": [3]}, "lora_task_id"),
        ({"return_generation_logits": [True]}, "return_generation_logits"),
        ({"embedding_bias": [[0.0, 1.0]]}, "embedding_bias"),
        ({"stop_words_list": [[1, 2], [5, -1]]}, "stop_words_list"),
        ({"end_id": [99999]}, "end_id"),
        ({"pad_id": [-3]}, "pad_id"),
    ],
)
def test_invalid_request_tensors_are_named(extra, name):
    with pytest.raises(InvalidRequest, match=name) as error:
        parse_request(tensors(**extra), vocab_size=4096, max_seq_len=256)
    assert str(error.value).startswith("[invalid argument]")


def test_request_parsing():
    seq = parse_request(
        tensors(
            stop_words_list=[[7, 8, 9], [2, 3, -1]],
            runtime_top_k=[5],
            random_seed=np.array([2**64 - 1], np.uint64),
            streaming=[True],
        ),
        vocab_size=4096,
        max_seq_len=256,
    )
    assert seq.stop_words == [[7, 8], [9]] and seq.params.top_k == 5 and seq.streaming
    assert seq.params.seed == 2**64 - 1 and not seq.params.greedy
