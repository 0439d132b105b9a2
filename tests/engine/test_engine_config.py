"""EngineConfig: one place for every engine setting, read from config.pbtxt and TRITONLM_* variables,
checked, resolved against the checkpoint, and the source of config.pbtxt and docs/settings.md's table."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from conftest import running_servers

import launcher
from tritonlm import config
from tritonlm.config import ConfigError, EngineConfig
from tritonlm.serving import pbtxt


def test_environment_wins_over_parameters_and_aliases_are_read():
    params = {"max_num_seqs": "4", "block_size": "", "max_running_seqs": "9", "model_dir": "/p"}
    env = {"TRITONLM_MAX_NUM_SEQS": "6", "MODEL_DIR": "/env"}
    cfg = EngineConfig.from_parameters(params, env)
    assert (cfg.max_num_seqs, cfg.block_size, cfg.model_dir) == (6, 16, "/p")  # "" is the default
    assert EngineConfig.from_parameters({"max_running_seqs": "9"}, {}).max_num_seqs == 9
    assert EngineConfig.from_parameters({}, {"MODEL_DIR": "/env"}).model_dir == "/env"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TRITONLM_MAX_SEQ_LEN": "lots"},
            "max_seq_len: environment variable TRITONLM_MAX_SEQ_LEN is 'lots'",
        ),
        ({"TRITONLM_ENABLE_PREFIX_CACHING": "maybe"}, "enable_prefix_caching"),
        ({"TRITONLM_DTYPE": "float64"}, "dtype: must be one of auto, float32, bfloat16, float16"),
        ({"TRITONLM_DEVICE": "tpu"}, "device"),
        ({"TRITONLM_MAX_SEQ_LEN": "1"}, "max_seq_len"),
        ({"TRITONLM_KV_CACHE_MEMORY_FRACTION": "1.5"}, "kv_cache_memory_fraction"),
        ({"TRITONLM_MAX_NUM_SEQS": "64", "TRITONLM_MAX_NUM_BATCHED_TOKENS": "32"}, "max_num_batched_tokens"),
        ({"TRITONLM_CPU_THREADS": "-1"}, "cpu_threads: must be >= 0"),
    ],
)
def test_bad_values_name_the_setting(env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        EngineConfig.from_parameters({}, env)


def test_derived_values(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    cfg = EngineConfig(str(tmp_path)).resolved()
    assert cfg.max_seq_len == config.MAX_SEQ_LEN_CAP  # capped
    (tmp_path / "config.json").write_text(json.dumps({"n_positions": 1024}))
    cfg = EngineConfig(str(tmp_path)).resolved()
    assert cfg.max_seq_len == 1024
    assert EngineConfig(str(tmp_path), max_seq_len=300).resolved().max_seq_len == 300
    # KV cache: as set, else a share of the free memory, capped on CPU; one sequence must fit.
    assert cfg.kv_cache_size(1000, "cpu", 10**12).kv_cache_blocks == 2 * 32 * 1024 // 16
    assert cfg.kv_cache_size(1000, "cuda", 10**6).kv_cache_blocks == 900
    assert (
        EngineConfig(str(tmp_path), kv_cache_blocks=70).resolved().kv_cache_size(1, "cpu", 0).kv_cache_blocks
        == 70
    )
    with pytest.raises(ConfigError, match="fewer than one sequence of max_seq_len 1024"):
        EngineConfig(str(tmp_path), kv_cache_blocks=8).resolved().kv_cache_size(1, "cpu", 0)
    with pytest.raises(ConfigError, match="MODEL_DIR"):
        EngineConfig().resolved()
    # The served engine's torch threads on CPU: as set, else every CPU this process may use.
    assert EngineConfig(str(tmp_path), cpu_threads=1).engine_threads() == 1
    assert EngineConfig(str(tmp_path)).engine_threads() == len(os.sched_getaffinity(0))


def test_config_pbtxt_and_readme_table_come_from_the_fields():
    assert pbtxt.stale() == []  # `make test` runs the same check
    engine = pbtxt.render()["engine"]
    for name in config.pbtxt_parameters():
        assert f'parameters {{ key: "{name}"' in engine
    table = config.settings_table()
    assert "| `max_seq_len` |" in table and "| `enable_prefix_caching` | `true` |" in table
    settings_doc = pbtxt.SETTINGS_DOC.read_text()
    drifted = pbtxt.with_settings_table(settings_doc).replace("| `block_size` | `16` |", "| x |")
    assert pbtxt.with_settings_table(drifted) != drifted


def test_the_launcher_reads_the_engines_settings(model_dir, monkeypatch):
    monkeypatch.setenv("TRITONLM_MAX_SEQ_LEN", "300")
    assert launcher.engine_config(model_dir).max_seq_len == 300
    monkeypatch.setenv("TRITONLM_MAX_SEQ_LEN", "many")
    with pytest.raises(ConfigError, match="TRITONLM_MAX_SEQ_LEN"):
        launcher.engine_config(model_dir)


@pytest.fixture(scope="module")
def short_context(model_dir):
    """`TRITONLM_MAX_SEQ_LEN=512 make run`: servers whose context is shorter than the checkpoint's."""
    with running_servers(model_dir, {"TRITONLM_MAX_SEQ_LEN": "512"}) as started:
        yield started


def test_a_request_without_max_tokens_fills_the_configured_context(short_context):
    """Preprocessing reads the engine's settings, TRITONLM_* variables included, so a chat request
    without max_tokens fills the context up to TRITONLM_MAX_SEQ_LEN (it used to ask for the
    checkpoint's 2048 and fail)."""
    servers = short_context
    body = {
        "model": servers.model_name,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(servers.frontend_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 512
    assert r.json()["choices"][0]["finish_reason"] == "length"
