"""The logits-processor pipeline: each processor alone on a batch (only its rows change, batched
equals row by row, transformers' processor where one exists), the pipeline's order, ids beyond the
vocabulary, the watermark settings, and a processor of the test's own plugged into the engine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from engine_helpers import request
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.sampling.logits_processors import (
    BadWords,
    EmbeddingBias,
    GrammarMask,
    LogitsPipeline,
    LogitsProcessor,
    MinLength,
    NoRepeatNGram,
    PresenceFrequencyPenalty,
    RepetitionPenalty,
    Watermark,
    default_pipeline,
)
from tritonlm.sampling.logits_processors.watermark import HASH_KEY
from tritonlm.sampling.metadata import SamplingMetadata
from tritonlm.sampling.params import SamplerInput, SamplingParams
from tritonlm.sampling.sampler import Sampler
from tritonlm.worker.model_runner import ModelRunner

VOCAB = 32


def row(params: SamplingParams, prompt=(1, 2, 3), output=()) -> SamplerInput:
    return SamplerInput(params, tuple(prompt), list(output), params.random_key())


def sample(
    logits: torch.Tensor, batch: list[SamplerInput], processors: LogitsPipeline | None = None
) -> list[int]:
    """The engine's sampler (default: the default pipeline) on one row per sequence: its tokens."""
    out = Sampler(processors or default_pipeline())(logits, SamplingMetadata.of_inputs(batch))
    return [made.tokens[0] for made in out.tokens.values()]


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def apply(processor: LogitsProcessor, logits: torch.Tensor, batch: list[SamplerInput]) -> torch.Tensor:
    out = logits.clone()
    LogitsPipeline([processor])(out, batch)
    return out


def check_batched(
    processor: LogitsProcessor, logits: torch.Tensor, batch: list[SamplerInput]
) -> torch.Tensor:
    """Applies `processor` to the batch: rows it does not concern stay as they were, the others equal
    what the processor makes of each row alone. Returns the batch's result."""
    got = apply(processor, logits, batch)
    assert any(processor.concerns(s) for s in batch) and not all(processor.concerns(s) for s in batch)
    for i, s in enumerate(batch):
        assert torch.equal(got[i], apply(processor, logits[i : i + 1], [s])[0])
        if not processor.concerns(s):
            assert torch.equal(got[i], logits[i])
    return got


def assert_same(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Same banned (-inf) entries, the same values elsewhere (up to float rounding)."""
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert torch.allclose(got[torch.isfinite(got)], expected[torch.isfinite(expected)])


# -- each processor alone ---------------------------------------------------------------------------
def test_embedding_bias():
    bias = torch.randn(VOCAB)
    batch = [
        row(SamplingParams(embedding_bias=bias)),
        row(SamplingParams()),
        row(SamplingParams(embedding_bias=-bias)),
    ]
    logits = random_logits(3)
    got = check_batched(EmbeddingBias(), logits, batch)
    assert torch.equal(got[0], logits[0] + bias) and torch.equal(got[2], logits[2] - bias)


def test_repetition_penalty_matches_transformers_row_by_row():
    gen = torch.Generator().manual_seed(1)
    tokens = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 12, 1, 30)]
    penalties = [1.3, 1.0, 0.7, 2.0]
    batch = [
        row(SamplingParams(repetition_penalty=p), prompt=t[:1], output=t[1:])
        for p, t in zip(penalties, tokens, strict=True)
    ]
    logits = random_logits(4)
    got = check_batched(RepetitionPenalty(), logits, batch)
    for i, (p, t) in enumerate(zip(penalties, tokens, strict=True)):
        assert_same(
            got[i : i + 1], RepetitionPenaltyLogitsProcessor(p)(torch.tensor([t]), logits[i : i + 1].clone())
        )


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    batch = [
        row(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), prompt=[7, 7], output=[3, 3, 4]),
        row(SamplingParams(), output=[3]),
        row(SamplingParams(frequency_penalty=-1.0), prompt=[9], output=[9, 9]),
    ]
    logits = random_logits(3)
    got = check_batched(PresenceFrequencyPenalty(), logits, batch)
    expected = logits.clone()
    expected[0, 3] -= 0.5 + 2 * 0.25
    expected[0, 4] -= 0.5 + 0.25
    expected[2, 9] += 2.0
    assert torch.allclose(got, expected)  # prompt tokens (7, and 9 of the prompt) count for nothing


def test_no_repeat_ngram_matches_transformers_with_several_sizes_in_one_batch():
    gen = torch.Generator().manual_seed(2)
    sizes_and_tokens = [
        (2, [5, 9, 9, 30, 5]),
        (3, torch.randint(0, 6, (40,), generator=gen).tolist()),
        (0, [1, 1, 1, 1]),
        (4, [1, 2, 3]),  # shorter than the n-gram: nothing to ban yet
        (1, [4, 8]),
        (2, torch.randint(0, 4, (25,), generator=gen).tolist()),
    ]
    batch = [
        row(SamplingParams(no_repeat_ngram_size=n), prompt=t[:2], output=t[2:]) for n, t in sizes_and_tokens
    ]
    logits = random_logits(len(batch))
    got = check_batched(NoRepeatNGram(), logits, batch)
    assert torch.isinf(got[0, 9]) and int(torch.isinf(got[0]).sum()) == 1
    for i, (n, t) in enumerate(sizes_and_tokens):
        if n:
            expected = NoRepeatNGramLogitsProcessor(n)(torch.tensor([t]), logits[i : i + 1].clone())
            assert_same(got[i : i + 1], expected)


def test_bad_words_match_transformers():
    words = [[3, 4], [6, 7, 8], [9], [2, 5]]
    batch = [
        row(SamplingParams(bad_words=words), prompt=[1, 6], output=[7]),  # ends with 6 7: bans 8
        row(SamplingParams(), output=[3]),
        row(SamplingParams(bad_words=words), prompt=[3]),  # ends with 3: bans 4
        row(SamplingParams(bad_words=[[10, 11]]), prompt=[1]),  # no match
    ]
    logits = random_logits(4)
    got = check_batched(BadWords(), logits, batch)
    for i in (0, 2, 3):
        s = batch[i]
        expected = NoBadWordsLogitsProcessor(s.params.bad_words)(
            torch.tensor([s.tokens]), logits[i : i + 1].clone()
        )
        assert_same(got[i : i + 1], expected)
    assert torch.isinf(got[0, [8, 9]]).all() and torch.isinf(got[2, [4, 9]]).all()
    assert torch.equal(got[3], logits[3])  # concerned, but nothing matched


def test_min_length_bans_the_end_id_and_one_token_stop_words_until_reached():
    batch = [
        row(SamplingParams(min_length=3, end_id=2, stop_token_ids=[5, 6]), output=[1]),
        row(SamplingParams(min_length=3, end_id=2), output=[1, 1, 1]),  # reached
        row(SamplingParams(min_length=4, end_id=-1, stop_token_ids=[7])),
        row(SamplingParams(min_length=4, end_id=-1)),  # nothing could end it: not concerned
    ]
    logits = random_logits(4)
    got = check_batched(MinLength(), logits, batch)
    for i, s in enumerate(batch):
        enders = ([s.params.end_id] if s.params.end_id >= 0 else []) + s.params.stop_token_ids
        if enders:
            reference = MinNewTokensLengthLogitsProcessor(len(s.prompt_ids), s.params.min_length, enders)
            assert_same(got[i : i + 1], reference(torch.tensor([s.tokens]), logits[i : i + 1].clone()))
    assert torch.isinf(got[0, [2, 5, 6]]).all() and torch.isinf(got[2, 7])


def tgi_greenlist(previous: int, vocab: int, gamma: float) -> list[int]:
    """TGI's WatermarkLogitsProcessor: a permutation seeded by hash key × previous token."""
    rng = torch.Generator().manual_seed(HASH_KEY * previous)
    return torch.randperm(vocab, generator=rng)[: int(gamma * vocab)].tolist()


@pytest.mark.parametrize("gamma, delta", [(0.5, 2.0), (0.25, 5.0), (1.0, 0.5)])
def test_watermark_adds_delta_to_the_green_list_of_the_previous_token(gamma, delta):
    batch = [
        row(SamplingParams(watermark=True), prompt=[4], output=[11]),
        row(SamplingParams()),
        row(SamplingParams(watermark=True), prompt=[1, 2, 17]),  # previous token: the prompt's last
    ]
    logits = random_logits(3)
    got = check_batched(Watermark(gamma, delta), logits, batch)
    for i, previous in ((0, 11), (2, 17)):
        expected = logits[i].clone()
        expected[tgi_greenlist(previous, VOCAB, gamma)] += delta
        assert torch.equal(got[i], expected)


# -- the pipeline -----------------------------------------------------------------------------------
def test_the_default_order():
    kinds = [type(p) for p in default_pipeline().processors]
    assert kinds == [
        EmbeddingBias,
        RepetitionPenalty,
        PresenceFrequencyPenalty,
        NoRepeatNGram,
        BadWords,
        MinLength,
        Watermark,
        GrammarMask,
    ]


def test_value_changes_apply_in_order_and_bans_stay_banned():
    # Token 1: raw -1, bias +5 → 4, seen in the prompt: repetition 2 → 2, generated once: frequency
    # 0.5 → 1.5, every token green (gamma 1): +2 → 3.5. Any other order gives another value.
    params = SamplingParams(
        embedding_bias=torch.eye(VOCAB)[1] * 5,
        repetition_penalty=2.0,
        frequency_penalty=0.5,
        watermark=True,
        min_length=5,
        end_id=0,
    )
    logits = torch.zeros(1, VOCAB)
    logits[0, 1] = -1.0
    pipeline = default_pipeline(EngineConfig(watermark_gamma=1.0, watermark_delta=2.0))
    pipeline(logits, [row(params, prompt=[1], output=[1])])
    assert logits[0, 1].item() == pytest.approx(3.5)
    assert logits[0, 0].item() == float("-inf")  # the end id, banned before the watermark's bonus
    assert logits[0, 2].item() == pytest.approx(2.0)


class Spy:
    """Concerns no row; records whether it was applied."""

    def __init__(self) -> None:
        self.applied = 0

    def concerns(self, s: SamplerInput) -> bool:
        return False

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        self.applied += 1


def test_a_processor_no_row_needs_is_not_applied():
    spy = Spy()
    logits = random_logits(2)
    out = LogitsPipeline([*default_pipeline().processors, spy])(logits.clone(), [row(SamplingParams())] * 2)
    assert spy.applied == 0 and torch.equal(out, logits)


def test_ids_beyond_the_logits_vocabulary_are_ignored():
    """A tokenizer may know more ids than the model has logits (added tokens): they must neither crash
    the processors nor change anything (they used to index out of range)."""
    big = [VOCAB, VOCAB + 5, 10**6]
    params = dict(
        repetition_penalty=1.5,
        presence_penalty=0.3,
        frequency_penalty=0.2,
        no_repeat_ngram_size=2,
        bad_words=[[3, VOCAB + 1], [VOCAB + 2]],
        min_length=6,
        end_id=1,
        stop_token_ids=[VOCAB + 3],
        watermark=True,
    )
    # With the big ids and without them: the same result, except that an n-gram starting at 3 now
    # also wants to ban VOCAB (skipped) besides 5.
    with_big = row(SamplingParams(**params), prompt=[3, big[0], 3, 5], output=[big[1], 3, 5, big[2], 3])
    without = row(SamplingParams(**params), prompt=[3, 5], output=[3, 5, 3])
    logits = random_logits(1)
    pipeline = default_pipeline()
    got = pipeline(logits.clone(), [with_big])
    expected = pipeline(logits.clone(), [without])
    assert torch.equal(got, expected)
    assert torch.isinf(got[0, [1, 5]]).all()
    tokens = sample(logits.repeat(2, 1), [with_big, without])  # and through the sampler
    assert tokens[0] == tokens[1] and 0 <= tokens[0] < VOCAB


# -- watermark settings -----------------------------------------------------------------------------
def test_watermark_settings_and_their_old_environment_variables():
    old_names = {"WATERMARK_GAMMA": "0.25", "WATERMARK_DELTA": "3"}
    cfg = EngineConfig.from_parameters({}, old_names)
    assert (cfg.watermark_gamma, cfg.watermark_delta) == (0.25, 3.0)
    cfg = EngineConfig.from_parameters(
        {"watermark_delta": "1.5"}, {**old_names, "TRITONLM_WATERMARK_GAMMA": "0.75"}
    )
    assert (cfg.watermark_gamma, cfg.watermark_delta) == (0.75, 1.5)  # the setting's own names win
    assert (EngineConfig().watermark_gamma, EngineConfig().watermark_delta) == (0.5, 2.0)


@pytest.mark.parametrize(
    "name, value",
    [("GAMMA", "0"), ("GAMMA", "1.5"), ("GAMMA", "nan"), ("DELTA", "-1"), ("DELTA", "inf"), ("DELTA", "nan")],
)
def test_bad_watermark_settings_name_the_setting(name, value):
    with pytest.raises(ConfigError, match=f"watermark_{name.lower()}: must be"):
        EngineConfig.from_parameters({}, {f"WATERMARK_{name}": value})


def test_the_sampler_reads_no_environment(monkeypatch):
    monkeypatch.setenv("WATERMARK_GAMMA", "0.1")
    monkeypatch.setenv("WATERMARK_DELTA", "9")
    watermark = default_pipeline().processors[-2]  # before the grammar mask
    assert isinstance(watermark, Watermark) and (watermark.gamma, watermark.delta) == (0.5, 2.0)


# -- the engine -------------------------------------------------------------------------------------
@dataclass
class FlaggedParams(SamplingParams):
    """Sampling parameters with a setting the engine does not know: a token to ban."""

    ban_token: int = -1


class BanToken:
    """A processor the engine does not ship: bans each flagged row's `ban_token`."""

    def concerns(self, s: SamplerInput) -> bool:
        return getattr(s.params, "ban_token", -1) >= 0

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        logits[rows, [s.params.ban_token for s in inputs]] = float("-inf")


def test_a_processor_of_ones_own_plugs_into_the_sampler():
    logits = random_logits(3)
    best = logits.argmax(-1).tolist()
    batch = [row(FlaggedParams(ban_token=best[0])), row(FlaggedParams()), row(SamplingParams())]
    pipeline = LogitsPipeline([*default_pipeline().processors, BanToken()])
    tokens = sample(logits.clone(), batch, pipeline)
    assert tokens[0] != best[0] and tokens[0] == logits[0].topk(2).indices[1].item()
    assert tokens[1:] == best[1:]
    assert sample(logits.clone(), batch) == best  # the default pipeline does not know it


@pytest.fixture(scope="module")
def watermark_runner(model_dir) -> ModelRunner:
    return ModelRunner(
        EngineConfig(
            str(model_dir), max_num_seqs=4, max_seq_len=64, watermark_gamma=0.25, watermark_delta=50.0
        )
    )


def run_to_the_end(engine: Engine, requests) -> list:
    seqs = [engine.add(req) for req in requests]
    while engine.scheduler.has_work():
        engine.step()
    return seqs


def test_the_engine_builds_its_pipeline_from_its_settings(watermark_runner):
    engine = Engine(watermark_runner, lambda seq, n: None)
    (marked,) = run_to_the_end(engine, [request([10, 11, 12], 8, SamplingParams(watermark=True))])
    # delta 50 dwarfs the logits: every greedy token is in its previous token's quarter of the vocab
    previous = [12, *marked.output_ids[:-1]]
    vocab = watermark_runner.vocab_size
    for before, token in zip(previous, marked.output_ids, strict=True):
        assert token in tgi_greenlist(before, vocab, 0.25)


def test_a_processor_of_ones_own_plugs_into_the_engine_for_sampling_and_beams(watermark_runner):
    engine = Engine(watermark_runner, lambda seq, n: None)
    plain, beams = run_to_the_end(
        engine,
        [
            request([10, 11, 12], 6, SamplingParams()),
            request([10, 11, 12], 6, SamplingParams(), beam_width=2),
        ],
    )
    banned, banned_in_beams = plain.output_ids[0], beams.group.results[0].tokens[0]

    engine.sampler.processors = LogitsPipeline([*engine.sampler.processors.processors, BanToken()])
    flagged = request([10, 11, 12], 6, FlaggedParams(ban_token=banned))
    flagged_beams = request([10, 11, 12], 6, FlaggedParams(ban_token=banned_in_beams), beam_width=2)
    other = request([10, 11, 12], 6, SamplingParams())
    flagged, flagged_beams, other = run_to_the_end(engine, [flagged, flagged_beams, other])
    assert banned not in flagged.output_ids and len(flagged.output_ids) == 6
    results = flagged_beams.group.results
    assert len(results) == 2 and all(banned_in_beams not in b.tokens for b in results)
    assert other.output_ids == plain.output_ids  # rows without the flag are untouched
