"""A served model's sampling defaults (frontend.sampling_defaults): the request's value, else
OVERRIDE_GENERATION_CONFIG's, else the checkpoint's generation_config.json's (GENERATION_CONFIG), else
the API's; each API's rule for whether it samples is kept. Without Triton (a fake answers the routes);
tests/e2e/test_sampling_defaults.py samples with them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_frontend_unit import FakeTriton

from frontend.app import create_app
from frontend.config import ConfigError, FrontendConfig
from frontend.engine_client.request import Job
from frontend.model_traits import read_traits
from frontend.openai_api.schema import ChatCompletionRequest
from frontend.sampling_defaults import SamplingDefaults, parse_override, read
from frontend.tgi.routes import plan
from frontend.tgi.schema import GenerateRequest

QWEN_LIKE = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": 2}


def checkpoint(root: Path, generation_config: dict) -> Path:
    root.mkdir(exist_ok=True)
    (root / "generation_config.json").write_text(json.dumps(generation_config))
    return root


def engine_sampling(job: Job) -> dict:
    values = job.values()
    names = ("temperature", "runtime_top_p", "runtime_top_k", "typical_p", "repetition_penalty")
    return {name: values[name] for name in names if name in values}


def test_the_request_wins_then_the_override_then_the_file_then_the_api(tmp_path):
    model = checkpoint(tmp_path / "m", {**QWEN_LIKE, "repetition_penalty": 1.05})
    from_file = read("auto", SamplingDefaults(), str(model))
    assert from_file == SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20, repetition_penalty=1.05)
    overridden = read("auto", parse_override('{"temperature": 0.5, "top_k": 0}'), str(model))
    assert overridden.as_dict() == {"temperature": 0.5, "top_p": 0.95, "top_k": 0, "repetition_penalty": 1.05}

    job = Job(prompt="Hi", defaults=overridden)
    assert engine_sampling(job) == {"temperature": 0.5, "runtime_top_p": 0.95, "repetition_penalty": 1.05}
    job = Job(prompt="Hi", temperature=0.9, top_k=3, repetition_penalty=1.0, defaults=overridden)
    assert engine_sampling(job) == {"temperature": 0.9, "runtime_top_p": 0.95, "runtime_top_k": 3}
    assert engine_sampling(Job(prompt="Hi")) == {"temperature": 1.0, "runtime_top_p": 1.0}  # the API's


def test_generation_config_auto_api_or_a_folder(tmp_path):
    model = checkpoint(tmp_path / "m", QWEN_LIKE)
    folder = checkpoint(tmp_path / "tuned", {"temperature": 0.2})
    assert read("api", SamplingDefaults(), str(model)) == SamplingDefaults()
    assert read("vllm", SamplingDefaults(), str(model)) == SamplingDefaults()  # vLLM's word for it
    assert read(str(folder), SamplingDefaults(), str(model)) == SamplingDefaults(temperature=0.2)
    assert read("auto", SamplingDefaults(), str(tmp_path / "none")) == SamplingDefaults()  # no file
    assert read("auto", SamplingDefaults(top_k=5), "") == SamplingDefaults(top_k=5)  # no checkpoint
    config = FrontendConfig(generation_config="api", override_generation_config='{"top_p": 0.5}')
    assert read_traits(config, str(model)).sampling == SamplingDefaults(top_p=0.5)


def test_do_sample_false_does_not_make_requests_greedy(tmp_path):
    """As vLLM: do_sample is not read; an OpenAI request without temperature samples."""
    model = checkpoint(tmp_path / "m", {"do_sample": False, "top_k": 4})
    job = Job(prompt="Hi", defaults=read("auto", SamplingDefaults(), str(model)))
    assert engine_sampling(job) == {"temperature": 1.0, "runtime_top_p": 1.0, "runtime_top_k": 4}
    greedy = Job(prompt="Hi", defaults=parse_override('{"temperature": 0, "top_k": 4}'))
    assert engine_sampling(greedy) == {"temperature": 0.0}  # the operator's way to greedy


def test_tgi_stays_greedy_unless_the_request_samples():
    defaults = SamplingDefaults(temperature=0.6, top_k=20, repetition_penalty=1.1)
    greedy = plan(GenerateRequest(inputs="Hi"))
    greedy.defaults = defaults
    assert engine_sampling(greedy) == {"repetition_penalty": 1.1}  # not a switch: applied
    sampled = plan(GenerateRequest.model_validate({"inputs": "Hi", "parameters": {"do_sample": True}}))
    sampled.defaults = defaults
    assert engine_sampling(sampled) == {
        "temperature": 0.6,
        "runtime_top_p": 1.0,
        "runtime_top_k": 20,
        "repetition_penalty": 1.1,
    }


def test_openai_explicit_no_limit_and_beam_search_keep_their_meaning():
    defaults = SamplingDefaults(temperature=0.6, top_k=20)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    job = ChatCompletionRequest.model_validate({**chat, "top_k": -1}).to_job()
    job.defaults = defaults
    assert engine_sampling(job) == {"temperature": 0.6, "runtime_top_p": 1.0}  # -1: no limit, as sent
    beams = ChatCompletionRequest.model_validate({**chat, "use_beam_search": True, "n": 2}).to_job()
    beams.defaults = defaults
    assert "temperature" not in beams.values() and beams.values()["beam_width"] == 2


def test_what_cannot_be_applied_is_logged_from_a_file_and_refused_from_the_setting(tmp_path, caplog):
    model = checkpoint(tmp_path / "m", {"temperature": -1, "min_p": 0.05, "top_k": 7, "max_new_tokens": 9})
    with caplog.at_level(logging.WARNING, logger="frontend.sampling_defaults"):
        assert read("auto", SamplingDefaults(), str(model)) == SamplingDefaults(top_k=7)
    logged = caplog.text
    assert "temperature must be >= 0" in logged and "min_p is not applied" in logged
    assert "max_new_tokens is not applied" in logged
    for text, says in (
        ('{"min_p": 0.1}', "'min_p': not applied; the keys are temperature, top_p, top_k"),
        ('{"top_p": 0}', "top_p must be in (0, 1], got 0"),
        ('{"top_k": 2.5}', "top_k must be an integer"),
        ('{"temperature": true}', "temperature must be a number"),
        ("[0.5]", "must be a JSON object"),
        ("{", "must be a JSON object"),
    ):
        with pytest.raises(ConfigError, match="OVERRIDE_GENERATION_CONFIG") as error:
            FrontendConfig.load([], {"OVERRIDE_GENERATION_CONFIG": text})
        assert says in str(error.value)
    with pytest.raises(ConfigError, match="no generation_config.json in"):
        FrontendConfig.load(["--generation-config", str(tmp_path)])


def test_v1_models_shows_each_models_defaults(tmp_path):
    model = checkpoint(tmp_path / "m", QWEN_LIKE)
    env = {"MODEL_DIR": str(model), "OVERRIDE_GENERATION_CONFIG": '{"top_p": 0.8}'}
    config = FrontendConfig.load([], env)
    with TestClient(create_app(config, triton=FakeTriton())) as client:
        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert cards["m"]["sampling_defaults"] == {"temperature": 0.6, "top_p": 0.8, "top_k": 20}
    assert all("sampling_defaults" not in c for name, c in cards.items() if name != "m")  # embeddings
