"""Speculative decoding inside the server (`speculative_model`): prompt lookup and a draft model
propose, the engine verifies; the output equals plain decoding (greedy), the acceptance rate is
reported, and the settings work through tritonserver."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import running_servers

from client.bench import engine_stats
from client.stream import StreamClient
from tritonlm.config import ConfigError, EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.request import Request
from tritonlm.model_gen import tiny as tiny_model
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker.model_runner import ModelRunner

# A prompt that repeats itself, so prompt lookup has something to find.
PHRASE = [300, 41, 2000, 13, 8, 900, 31, 7]
PROMPTS = [PHRASE * 3 + [300, 41], [5, 77, 1200, 9, 45, 3001, 17, 22, 5, 77, 1200], PHRASE + PHRASE[:3]]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    return tiny_model.generate(tmp_path_factory.mktemp("draft"), seed=1, size="draft")


def engine_for(model_dir, **settings) -> Engine:
    config = EngineConfig(str(model_dir), dtype="float32", max_num_seqs=4, max_seq_len=128, **settings)
    return Engine(ModelRunner(config), lambda seq, n: None)


def generate(engine: Engine, params: SamplingParams | None = None, new: int = 24) -> list[list[int]]:
    seqs = [engine.add(Request(tuple(p), new, params or SamplingParams())) for p in PROMPTS]
    while engine.scheduler.has_work():
        engine.step()
    assert engine.stats()["kv_blocks_used"] == 0
    return [s.output_ids for s in seqs]


@pytest.fixture(scope="module")
def plain(model_dir) -> list[list[int]]:
    return generate(engine_for(model_dir))


def test_prompt_lookup_gives_the_greedy_output(model_dir, plain):
    engine = engine_for(model_dir, speculative_model="[ngram]", num_speculative_tokens=3)
    assert generate(engine) == plain
    stats = engine.stats()
    assert stats["spec_proposed_tokens"] > 0 and 0.0 <= stats["spec_acceptance_rate"] <= 1.0


def test_draft_model_gives_the_greedy_output(model_dir, draft_dir, plain):
    small = engine_for(model_dir, speculative_model=str(draft_dir))
    assert generate(small) == plain
    assert small.stats()["spec_proposed_tokens"] > 0
    # The target as its own draft: every proposal is right, so each step makes k + 1 tokens.
    same = engine_for(model_dir, speculative_model=str(model_dir), num_speculative_tokens=4)
    assert generate(same) == plain
    assert same.stats()["spec_acceptance_rate"] == 1.0 and same.steps < 3 * 24 / 2


def test_sampled_requests_with_speculation_stay_seeded(model_dir):
    params = SamplingParams(temperature=0.8, top_p=1.0, seed=7)
    engine = engine_for(model_dir, speculative_model=str(model_dir))
    first = generate(engine, params)
    assert [len(o) for o in first] == [24] * 3 and generate(engine, params) == first


def test_speculative_settings_are_checked():
    for settings, name in (
        ({"speculative_model": "/no/such/dir"}, "speculative_model"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"ngram_prompt_lookup_min": 5}, "ngram_prompt_lookup_min"),
    ):
        with pytest.raises(ConfigError, match=name):
            replace(EngineConfig(), **settings)


@pytest.mark.e2e
@pytest.mark.parametrize("proposer", ["[ngram]", "draft model"])
def test_speculation_through_tritonserver(model_dir, draft_dir, plain, proposer):
    speculative_model = proposer if proposer == "[ngram]" else str(draft_dir)
    settings = {"TRITONLM_SPECULATIVE_MODEL": speculative_model, "TRITONLM_NUM_SPECULATIVE_TOKENS": "3"}
    with running_servers(model_dir, settings) as servers:
        client = StreamClient(servers.grpc_url)
        try:
            for prompt, expected in zip(PROMPTS, plain, strict=True):
                values = {"input_ids": prompt, "request_output_len": 24, "streaming": True}
                responses = list(client.generate("engine", values))
                tokens = [int(t) for r in responses for t in r["output_ids"].reshape(-1)]
                assert tokens == expected
        finally:
            client.close()
        assert "spec_acceptance_rate" in engine_stats(servers.metrics_url)
