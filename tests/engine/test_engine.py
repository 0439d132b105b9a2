"""The engine without Triton: batching against transformers, sampling rules, request validation."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from engine_helpers import fp32_runner, request, run_all, sequence
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import (
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TypicalLogitsWarper,
)

from tritonlm import contract
from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.request import Request
from tritonlm.engine.sequence import Sequence
from tritonlm.errors import InvalidRequest
from tritonlm.sampling.logits_processors import (
    LogitsPipeline,
    NoRepeatNGram,
    PresenceFrequencyPenalty,
    RepetitionPenalty,
    default_pipeline,
)
from tritonlm.sampling.metadata import SamplingMetadata
from tritonlm.sampling.ops import filter_logits
from tritonlm.sampling.sampler import Sampler, SamplerInput, SamplerOutput, SamplingParams
from tritonlm.serving import engine_outputs, pbtxt
from tritonlm.serving.engine_inputs import parse_request
from tritonlm.serving.engine_outputs import response_tensors
from tritonlm.text.postprocess import TEXT_NAMES
from tritonlm.text.tokenization import load_tokenizer
from tritonlm.worker import cpu_kernels
from tritonlm.worker.model_runner import ModelRunner


def test_config_pbtxt_matches_the_contract():
    assert pbtxt.stale() == []


def test_every_engine_output_is_built_in_one_place():
    """A response carries every declared output: each has a tensor builder or is a text the
    ResponseBuilder makes, never both (an output added to the contract needs its builder)."""
    builders = set(engine_outputs._BUILDERS)
    assert builders.isdisjoint(TEXT_NAMES)
    assert builders | TEXT_NAMES == {t.name for t in contract.ENGINE_OUTPUTS} == engine_outputs.ALL_OUTPUTS


@pytest.fixture(scope="module")
def runner(attention_backend, model_dir) -> ModelRunner:
    return fp32_runner(model_dir, attention_backend, max_num_seqs=6, max_seq_len=256)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def generate(model, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def greedy_refs(hf_model) -> tuple[list[list[int]], list[list[int]]]:
    """Ten prompts of 1-59 tokens and transformers' greedy 20 tokens for each."""
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(5, 4000, (int(n),), generator=gen).tolist()
        for n in torch.randint(1, 60, (10,), generator=gen)
    ]
    return prompts, [generate(hf_model, p, 20) for p in prompts]


def test_batched_greedy_equals_transformers_generate(runner, greedy_refs):
    prompts, refs = greedy_refs
    # More requests than running slots, joining mid-flight.
    _, seqs = run_all(runner, [request(p, 20, SamplingParams()) for p in prompts], stagger=True)
    for seq, ref in zip(seqs, refs, strict=True):
        assert seq.output_ids == ref
        assert seq.out.finish_reason == "length"
        assert [t.batch_size for t in seq.out.timings] and len(seq.out.timings) == 20


def test_a_cache_too_small_for_the_load_preempts_and_outputs_stay_the_same(
    attention_backend, model_dir, greedy_refs
):
    prompts, refs = greedy_refs
    # 6 blocks of 16 tokens: room for about two of the ten sequences at a time.
    small = fp32_runner(model_dir, attention_backend, max_num_seqs=8, max_seq_len=96, kv_cache_blocks=6)
    small.attention.workspace = None  # decode attention over gathered blocks (the GPU path) here
    engine, seqs = run_all(small, [request(p, 20, SamplingParams()) for p in prompts])
    assert engine.stats()["preemptions"] > 0
    assert any(s.num_preemptions for s in seqs)
    assert [s.output_ids for s in seqs] == refs
    assert all(s.out.finish_reason == "length" for s in seqs)


def test_beams_that_could_never_run_together_are_refused_not_left_waiting(model_dir):
    """They would preempt one another forever (the request reader refuses them first, as a 400)."""
    small = fp32_runner(model_dir, "sdpa", max_num_seqs=2, max_seq_len=96, kv_cache_blocks=6)
    engine = Engine(small, lambda seq, n: None)
    with pytest.raises(ValueError, match="^beam_width: at most 2"):
        engine.add(request([5, 6, 7], 20, beam_width=3))
    with pytest.raises(ValueError, match="^beam_width: 2 beams of 3 \\+ 80 tokens need up to 12 KV-cache"):
        engine.add(request([5, 6, 7], 80, beam_width=2))
    engine.stop()


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(attention_backend, model_dir, monkeypatch):
    runner = fp32_runner(model_dir, attention_backend, max_num_seqs=4, max_seq_len=64)
    real = runner.execute
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", flaky)
    engine, (failed,) = run_all(runner, [request([1, 2, 3], 10, SamplingParams())])
    assert failed.out.finish_reason == "error" and "boom" in failed.out.error
    assert engine.stats()["kv_blocks_used"] == 0
    _, (ok,) = run_all(runner, [request([1, 2, 3], 10, SamplingParams())])
    assert ok.out.finish_reason == "length" and len(ok.output_ids) == 10


def test_chunked_prefill_gives_the_same_outputs(attention_backend, model_dir, greedy_refs):
    prompts, refs = greedy_refs
    chunked = fp32_runner(
        model_dir, attention_backend, max_num_seqs=4, max_num_batched_tokens=8, max_seq_len=96
    )
    engine, seqs = run_all(chunked, [request(p, 20, SamplingParams()) for p in prompts])
    assert [s.output_ids for s in seqs] == refs
    # Every prompt over 8 tokens took several steps: more steps than tokens generated per sequence.
    assert engine.stats()["steps"] > 20 + sum(len(p) for p in prompts) // 8


def test_a_shared_prefix_is_computed_once_and_outputs_stay_the_same(attention_backend, model_dir, hf_model):
    gen = torch.Generator().manual_seed(1)
    system = torch.randint(5, 4000, (100,), generator=gen).tolist()
    cached = fp32_runner(model_dir, attention_backend, max_num_seqs=4, max_seq_len=256)
    engine, (first,) = run_all(cached, [request(system + [11, 12, 13], 12, SamplingParams())])
    (second,) = run_all_on(engine, [request(system + [21, 22], 12, SamplingParams())])
    assert first.out.cached_tokens == 0
    assert second.out.cached_tokens == 96  # the six full 16-token blocks of the shared 100 tokens
    assert engine.stats()["prefix_cache_hits"] == 96
    assert second.output_ids == generate(hf_model, second.prompt_ids, 12)
    uncached = fp32_runner(
        model_dir, attention_backend, max_num_seqs=4, max_seq_len=256, enable_prefix_caching=False
    )
    _, (again,) = run_all(uncached, [request(list(second.prompt_ids), 12, SamplingParams())])
    assert again.out.cached_tokens == 0 and again.output_ids == second.output_ids


def test_requests_admitted_together_share_a_prefix_computed_in_that_step(runner, hf_model):
    shared = list(range(100, 132))  # two full blocks
    engine = Engine(runner, lambda seq, n: None)
    first, second = run_all_on(  # both queued before the first step: admitted together
        engine,
        [
            request(shared + [5, 6, 7], 8, SamplingParams()),
            request(shared + [9], 8, SamplingParams()),  # all but its last token cached
        ],
    )
    assert first.out.cached_tokens == 0 and second.out.cached_tokens == 32 and engine.steps == 8
    for seq in (first, second):
        assert seq.output_ids == generate(hf_model, seq.prompt_ids, 8)


def run_all_on(engine: Engine, requests: list[Request]) -> list[Sequence]:
    """Like run_all, on an engine that already ran (its prefix cache kept)."""
    seqs = [engine.add(req) for req in requests]
    while engine.scheduler.has_work():
        engine.step()
    return seqs


def test_prompt_and_generation_logits_hooks(attention_backend, model_dir, hf_model):
    runner = fp32_runner(
        model_dir, attention_backend, max_num_seqs=4, max_num_batched_tokens=8, max_seq_len=96
    )
    prompt = list(range(30, 60))
    _, (other, seq) = run_all(
        runner,
        [
            request(prompt[:20], 4, SamplingParams()),  # same prefix: must not make seq skip any row
            request(prompt, 4, SamplingParams(return_context_logits=True, return_generation_logits=True)),
        ],
    )
    with torch.no_grad():
        full = hf_model(torch.tensor([prompt + seq.output_ids[:-1]])).logits[0]
    context = torch.cat(seq.out.prompt_logits)
    assert context.dtype == torch.float32 and context.shape == (30, runner.vocab_size)
    assert torch.allclose(context, full[:30], atol=1e-4)
    assert len(seq.out.generation_logits) == 4
    assert torch.allclose(torch.stack(seq.out.generation_logits), full[29:], atol=1e-4)


def test_prompt_log_probs_are_the_samplers_chunk_by_chunk(model_dir):
    runner = ModelRunner(
        EngineConfig(
            str(model_dir), dtype="float32", max_num_seqs=4, max_num_batched_tokens=8, max_seq_len=96
        )
    )
    prompt = list(range(30, 50))  # fed in chunks of 8
    params = SamplingParams(
        temperature=0.7,
        top_k=5,
        seed=1,
        return_log_probs=True,
        num_top_log_probs=2,
        return_prompt_log_probs=True,
        return_context_logits=True,
    )
    _, (seq,) = run_all(runner, [request(prompt, 3, params)])
    tensors = response_tensors(seq, 0, 3, "length")
    # The rule over the whole prompt at once, on the context logits the response reports.
    whole = (torch.cat(seq.out.prompt_logits)[:-1] / 0.7).log_softmax(-1)
    chosen = [0.0, *whole.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1).tolist()]
    assert np.array_equal(tensors["prompt_log_probs"], np.asarray(chosen, np.float32))
    top = whole.topk(2)
    assert tensors["prompt_top_ids"].tolist() == [[-1, -1], *top.indices.tolist()]
    assert np.array_equal(tensors["prompt_top_log_probs"][1:], top.values.numpy())
    assert tensors["context_logits"].shape == (1, 20, runner.vocab_size)


def test_fork_copies_a_shared_partial_block_before_writing(attention_backend, model_dir, hf_model):
    runner = fp32_runner(model_dir, attention_backend, max_num_seqs=4, max_seq_len=96, block_size=4)
    engine = Engine(runner, lambda seq, n: None)
    parent = engine.add(request([5, 6, 7, 8, 9, 10], 8, SamplingParams()))  # 1.5 blocks
    engine.step()  # prefill; its first token sampled
    child = sequence(parent.prompt_ids, 8, SamplingParams())
    child.output_ids = [77]  # a different continuation of the same 6 tokens
    engine.scheduler.fork(parent, child)
    while parent.num_tokens < 12:
        engine.step()
    for seq in (parent, child):
        with torch.no_grad():
            logits = hf_model(torch.tensor([[*seq.prompt_ids, *seq.output_ids]])).logits[0]
        assert seq.output_ids[1:] == logits[6:-1].argmax(-1).tolist()
    assert parent.block_table[0] == child.block_table[0] and parent.block_table[1] != child.block_table[1]


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_other_decoders_work_through_the_attention_interface(arch, tmp_path):
    from transformers import AutoConfig

    config = {
        "gpt2": dict(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=512),
        "qwen2": dict(
            num_hidden_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            max_position_embeddings=128,
        ),
    }[arch]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **config)).eval()
    model.save_pretrained(tmp_path)
    runner = ModelRunner(
        EngineConfig(str(tmp_path), dtype="float32", max_num_seqs=4, max_num_batched_tokens=16, block_size=4)
    )
    # GPT-2 is not Llama-shaped: transformers' modules run it; Qwen2 takes the decoder stack
    stacked = arch == "qwen2" and cpu_kernels.unavailable() is None
    assert (runner.fast_path is not None) == stacked
    prompts = [[3, 4, 5], list(range(10, 40)), [7] * 9]
    _, seqs = run_all(runner, [request(p, 10, SamplingParams()) for p in prompts])
    assert [s.output_ids for s in seqs] == [generate(model, p, 10) for p in prompts]


def test_end_id_stop_words_and_min_length(runner):
    _, (probe,) = run_all(runner, [request([10, 11, 12], 12, SamplingParams())])
    out = probe.output_ids
    ended = request([10, 11, 12], 12, SamplingParams(end_id=out[3]))
    stopped = request([10, 11, 12], 12, SamplingParams(), stop_words=[out[2:4]])
    delayed = request([10, 11, 12], 12, SamplingParams(end_id=out[0], min_length=5))
    _, (ended, stopped, delayed) = run_all(runner, [ended, stopped, delayed])
    assert (ended.output_ids, ended.out.finish_reason) == (out[:4], "end_id")
    assert (stopped.output_ids, stopped.out.finish_reason) == (out[:4], "stop_words")
    assert len(delayed.output_ids) >= 5 and out[0] not in delayed.output_ids[:5]


def test_a_stop_string_spanning_tokens_stops_and_cuts_the_text(runner, model_dir):
    tokenizer = load_tokenizer(str(model_dir))
    _, (probe,) = run_all(runner, [request([10, 11, 12], 24, SamplingParams())])
    out = probe.output_ids
    # A stop string made of the end of token k's text and the start of token k + 1's.
    for k in range(1, len(out) - 1):
        before, after = tokenizer.decode(out[:k]), tokenizer.decode(out[: k + 1])
        stop = before[-2:] + after[len(before) : len(before) + 2]
        if len(before) >= 2 and len(after) >= len(before) + 2 and stop not in before:
            break
    else:
        pytest.skip("no two tokens of this output have text on both sides")
    seq = request([10, 11, 12], 24, SamplingParams(), stop_strings=(stop,), text_wanted=True)
    _, (seq,) = run_all(runner, [seq], tokenizer=tokenizer)
    assert seq.output_ids == out[: k + 1] and seq.out.finish_reason == "stop_words"
    text = "".join(seq.out.texts) + seq.out.text_end
    assert text == after[: after.index(stop)] and seq.text.matched == stop
    # Before min_length a stop string does not count (nor does its text get cut).
    late = request([10, 11, 12], 24, SamplingParams(min_length=k + 3), stop_strings=(stop,), text_wanted=True)
    _, (late,) = run_all(runner, [late], tokenizer=tokenizer)
    assert late.output_ids[: k + 3] == out[: k + 3] and len(late.output_ids) > k + 1


def test_cancelled_sequence_leaves_within_a_step(runner):
    cancel = threading.Event()
    outputs = []

    def on_output(s: Sequence, n: int) -> None:
        outputs.append(len(s.output_ids))
        if len(s.output_ids) == 3:
            cancel.set()

    engine = Engine(runner, on_output)
    seq = engine.add(request([1, 2, 3], 200, SamplingParams()), is_cancelled=cancel.is_set)
    waiting = None
    while not seq.out.finish_reason:
        engine.step()
        if len(seq.output_ids) == 2:
            waiting = engine.add(request([1, 2, 3], 200, SamplingParams()), is_cancelled=lambda: True)
    assert seq.out.finish_reason == "cancelled" and len(seq.output_ids) == 3
    assert waiting.out.finish_reason == "cancelled" and not waiting.output_ids
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.scheduler.has_work()


def test_a_full_waiting_queue_refuses_requests(attention_backend, model_dir):
    runner = fp32_runner(model_dir, attention_backend, max_num_seqs=2, max_seq_len=64, max_queue_size=2)
    engine = Engine(runner, lambda seq, n: None)
    assert all(engine.add(request([1, 2], 4, SamplingParams())) for _ in range(4))
    assert not engine.add(request([1, 2], 4, SamplingParams()))
    while engine.scheduler.waiting:  # room again as soon as requests finish
        engine.step()
    assert engine.add(request([1, 2], 4, SamplingParams()))


def test_a_request_of_several_sequences_is_queued_whole_or_refused(attention_backend, model_dir):
    """num_return_sequences' sampled sequences (Request.sequences) join the queue all together or
    not at all; each runs as the single request of its seed would."""
    from dataclasses import replace

    runner = fp32_runner(model_dir, attention_backend, max_num_seqs=2, max_seq_len=64, max_queue_size=2)
    engine = Engine(runner, lambda seq, n: None)
    sampled = SamplingParams(temperature=1.0, seed=5)
    three = replace(request([1, 2], 4, sampled), num_return_sequences=3)
    seqs = engine.add_all(three.sequences())
    assert seqs is not None and [s.request.sequence_index for s in seqs] == [0, 1, 2]
    assert engine.add_all(three.sequences()) is None and len(engine.scheduler.waiting) == 3  # 2 + 2 at most
    while engine.scheduler.has_work():
        engine.step()
    alone = [run_all(runner, [request([1, 2], 4, replace(sampled, seed=5 + i))])[1][0] for i in range(3)]
    assert [s.output_ids for s in seqs] == [a.output_ids for a in alone]


def test_settings_from_parameters_and_environment(monkeypatch):
    params = {"max_running_seqs": "7", "block_size": "8", "enable_prefix_caching": "false", "dtype": ""}
    monkeypatch.setenv("TRITONLM_MAX_QUEUE_SIZE", "3")
    settings = EngineConfig.from_parameters({**params, "model_dir": "/m"})
    assert (settings.max_num_seqs, settings.block_size, settings.enable_prefix_caching) == (7, 8, False)
    assert settings.max_queue_size == 3 and settings.dtype == "auto" and settings.model_dir == "/m"


def sampler_input(params: SamplingParams, prompt=(1, 2, 3), output=(), seed=None) -> SamplerInput:
    params.seed = seed
    return SamplerInput(params, list(prompt), list(output), params.random_key())


def sample(logits: torch.Tensor, batch: list[SamplerInput]) -> SamplerOutput:
    """The engine's sampler (default pipeline) on one row per sequence."""
    return Sampler(default_pipeline())(logits, SamplingMetadata.of_inputs(batch))


def tokens_of(out: SamplerOutput) -> list[int]:
    return [made.tokens[0] for made in out.tokens.values()]


def test_greedy_rules():
    logits = torch.randn(3, 50)
    batch = [sampler_input(SamplingParams()), sampler_input(SamplingParams(temperature=0.0, top_p=0.9))]
    batch.append(sampler_input(SamplingParams(top_k=1, temperature=2.0)))
    assert all(s.params.greedy for s in batch)
    assert tokens_of(sample(logits.clone(), batch)) == logits.argmax(-1).tolist()


MIXED_ROWS = [  # (settings, prompt, output, seed): every kind of row the sampler treats differently
    (dict(), (1, 2, 3), (), None),  # greedy
    (dict(temperature=0.8, top_p=0.95), (1, 2, 3), (), 7),
    (dict(temperature=1.3, top_k=5), (4, 5), (6,), 3),
    (dict(top_k=0, top_p=0.6, temperature=0.7), (9,), (9, 9), 11),
    (dict(typical_p=0.5, top_p=1.0), (1,), (2, 3), 5),
    (dict(temperature=0.9, top_p=0.9, repetition_penalty=1.4, presence_penalty=0.5), (7, 8), (7, 8, 8), 13),
    (dict(temperature=1.0, top_k=8, frequency_penalty=0.7, no_repeat_ngram_size=2), (1, 2, 1), (2,), 17),
    (dict(temperature=0.5, top_k=5, return_log_probs=True, num_top_log_probs=3), (3,), (), 19),
    (dict(return_log_probs=True), (2, 4), (6,), None),  # greedy with log probs
    (dict(temperature=0.6, top_p=0.8, min_length=4, end_id=0, bad_words=[[5]]), (1,), (), 23),
    (dict(temperature=0.8, top_p=0.95), (1, 2, 3), (), 29),  # the second row's settings, another seed
]


def mixed_input(k: int) -> SamplerInput:
    """A fresh input (its own random key) for row k of MIXED_ROWS."""
    settings, prompt, output, seed = MIXED_ROWS[k]
    return sampler_input(SamplingParams(**settings), prompt, output, seed)


def test_seeded_sampling_is_reproducible_and_row_independent():
    logits = torch.randn(len(MIXED_ROWS), 100, generator=torch.Generator().manual_seed(0))
    together = sample(logits.clone(), [mixed_input(k) for k in range(len(MIXED_ROWS))])
    assert len(together.tokens) == len(MIXED_ROWS)
    for k, made in together.tokens.items():
        alone = sample(logits[k : k + 1].clone(), [mixed_input(k)]).tokens[0]
        assert made.tokens == alone.tokens
        assert made.log_probs == alone.log_probs and made.top_ids == alone.top_ids
        assert made.top_log_probs == alone.top_log_probs
    assert together.tokens[7].log_probs is not None and len(together.tokens[7].top_ids[0]) == 3
    assert together.tokens[0].log_probs is None  # not asked
    again = sample(logits.clone(), [mixed_input(k) for k in range(len(MIXED_ROWS))])
    assert tokens_of(again) == tokens_of(together)  # the same seeds draw the same tokens
    # The old check: a seeded row draws the same wherever it sits in the batch.
    params = dict(temperature=0.8, top_p=0.95)
    alone = tokens_of(sample(logits[:1].clone(), [sampler_input(SamplingParams(**params), seed=7)]))
    batch = [sampler_input(SamplingParams(**params), seed=s) for s in (3, 7, 9, 11)]
    batch[0], batch[1] = batch[1], batch[0]
    assert tokens_of(sample(logits[:4].clone(), batch))[0] == alone[0]


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.5, 0.3, 0.15, 0.05]]))
    batch = [sampler_input(SamplingParams(top_k=2, top_p=1.0)), sampler_input(SamplingParams(top_p=0.79))]
    kept = torch.isfinite(filter_logits(logits.clone(), batch))
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
    s = sampler_input(params, prompt=tokens[:2], output=tokens[2:])
    LogitsPipeline([RepetitionPenalty(), NoRepeatNGram()])(got, [s])
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.allclose(got[torch.isfinite(got)], expected[torch.isfinite(expected)])

    warped = TypicalLogitsWarper(0.5)(ids, logits.clone())
    mine = filter_logits(logits.clone(), [sampler_input(SamplingParams(typical_p=0.5, top_p=1.0))])
    assert torch.equal(torch.isfinite(mine), torch.isfinite(warped))


def test_presence_and_frequency_penalties():
    logits = torch.zeros(1, 10)
    s = sampler_input(
        SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), prompt=[1], output=[3, 3, 4]
    )
    LogitsPipeline([PresenceFrequencyPenalty()])(logits, [s])
    assert logits[0, 3].item() == pytest.approx(-1.0) and logits[0, 4].item() == pytest.approx(-0.75)
    assert logits[0, 1].item() == 0.0  # the prompt is not penalised (OpenAI's rule)


def test_log_probs_are_log_softmax_after_temperature():
    logits = torch.randn(1, 30)
    s = sampler_input(SamplingParams(temperature=0.5, top_k=5, return_log_probs=True), seed=1)
    made = sample(logits.clone(), [s]).tokens[0]
    expected = (logits[0] / 0.5).log_softmax(-1)[made.tokens[0]].item()
    assert made.log_probs[0] == pytest.approx(expected, abs=1e-5)


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
        ({"beam_width": [0]}, "beam_width"),
        ({"len_penalty": [0.5]}, "len_penalty"),
        ({"lora_task_id": [3]}, "lora_task_id"),
        ({"num_top_log_probs": [21]}, "num_top_log_probs"),
        ({"num_top_log_probs": [2]}, "num_top_log_probs"),  # without return_log_probs
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
    request = parse_request(
        tensors(
            stop_words_list=[[7, 8, 9], [2, 3, -1]],
            runtime_top_k=[5],
            random_seed=np.array([2**64 - 1], np.uint64),
            streaming=[True],
        ),
        vocab_size=4096,
        max_seq_len=256,
    )
    assert request.stop_words == ((7, 8), (9,)) and request.params.top_k == 5 and request.streaming
    assert request.params.seed == 2**64 - 1 and not request.params.greedy
