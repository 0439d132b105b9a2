"""A model's sampling defaults end to end (frontend.sampling_defaults): a checkpoint whose
generation_config.json sets `temperature` and `top_k` samples with them when a request leaves them
out, on every API; OVERRIDE_GENERATION_CONFIG wins over the file; a request's own values win over
both. Two frontends beside the session's tritonserver serve a copy of its checkpoint's JSON files
(all the frontend reads) under the same name, so the same Triton models answer."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from conftest import Servers, frontend_beside

FILE = {"temperature": 0.3, "top_k": 3}  # what the checkpoint's generation_config.json adds
PROMPT = "Once upon a time"
SEED = 11


@pytest.fixture(scope="module")
def checkpoint(servers: Servers, tmp_path_factory) -> Path:
    """The served checkpoint's JSON files, its generation_config.json setting FILE (its do_sample:
    false, where it has one, kept: it does not make requests greedy)."""
    copy = tmp_path_factory.mktemp("generation-config") / servers.model_name
    copy.mkdir()
    for path in servers.model_dir.glob("*.json"):
        shutil.copy(path, copy)
    config_path = copy / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps({**config, **FILE}))
    return copy


def beside(servers: Servers, checkpoint: Path, tmp_path_factory, **env: str) -> Iterator[str]:
    env = {"MODEL_DIRS": f"{servers.model_name}={checkpoint}", **env}
    with frontend_beside(servers, env, tmp_path_factory.mktemp("defaults")) as url:
        yield url


@pytest.fixture(scope="module")
def from_file(servers, checkpoint, tmp_path_factory) -> Iterator[str]:
    yield from beside(servers, checkpoint, tmp_path_factory)


@pytest.fixture(scope="module")
def overridden(servers, checkpoint, tmp_path_factory) -> Iterator[str]:
    """The same checkpoint with the operator's `temperature: 0` over the file's: greedy by default."""
    yield from beside(servers, checkpoint, tmp_path_factory, OVERRIDE_GENERATION_CONFIG='{"temperature": 0}')


def completion(url: str, servers: Servers, **params) -> str:
    body = {"model": servers.model_name, "prompt": PROMPT, "max_tokens": 16, "ignore_eos": True, **params}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def tgi(url: str, **parameters) -> str:
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 16, **parameters}}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["generated_text"]


def test_v1_models_and_the_responses_echo_show_the_defaults(from_file, overridden, servers):
    for url, shown in ((from_file, FILE), (overridden, {**FILE, "temperature": 0.0})):
        cards = httpx.get(url + "/v1/models", timeout=30).json()["data"]
        assert next(c for c in cards if c["id"] == servers.model_name)["sampling_defaults"] == shown
    body = {"model": servers.model_name, "input": "Hi", "max_output_tokens": 2}
    r = httpx.post(from_file + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["temperature"] == 0.3, r.text


def test_a_request_without_temperature_or_top_k_samples_with_the_files(from_file, servers):
    plain = servers.frontend_url  # the same model, without the defaults
    defaults = completion(from_file, servers, seed=SEED)
    assert defaults == completion(plain, servers, seed=SEED, **FILE)
    assert defaults != completion(plain, servers, seed=SEED)  # temperature 1, no top-k
    assert defaults != completion(plain, servers, temperature=0)
    # The request's own values win: temperature 1 and top_k -1 (no limit), as on the plain frontend.
    assert completion(from_file, servers, seed=SEED, temperature=1.0, top_k=-1) == completion(
        plain, servers, seed=SEED
    )
    # TGI samples only when asked (do_sample); then with the file's defaults.
    assert tgi(from_file) == tgi(plain)  # greedy
    assert tgi(from_file, do_sample=True, seed=SEED) == tgi(plain, seed=SEED, **FILE)


def test_the_override_wins_over_the_file_on_every_api(overridden, from_file, servers):
    plain = servers.frontend_url
    greedy = completion(plain, servers, temperature=0)
    assert completion(overridden, servers, seed=SEED) == greedy
    assert completion(from_file, servers, seed=SEED) != greedy
    # The Anthropic SDK sends no temperature: its requests get the model's defaults, here greedy.
    message = {"model": servers.model_name, "max_tokens": 12, "messages": [{"role": "user", "content": "Hi"}]}
    sdk = anthropic.Anthropic(base_url=overridden, api_key="unused", max_retries=0)
    reference = anthropic.Anthropic(base_url=plain, api_key="unused", max_retries=0)
    text = sdk.messages.create(**message).content[0].text
    assert text == reference.messages.create(**message, extra_body={"temperature": 0}).content[0].text
