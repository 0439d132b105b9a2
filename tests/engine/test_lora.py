"""LoRA without Triton: the PEFT → TensorRT-LLM tensor conversion, the adapter store (task-id
cache, eviction, errors) and mixed-adapter batches against transformers' merged PEFT model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from engine_helpers import fp32_runner, request
from lora_helpers import make_adapter, merged_generate
from safetensors.torch import load_file
from test_engine import run_all

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.errors import InvalidRequest
from tritonlm.lora.format import MODULE_IDS, parse_lora_modules, peft_to_tensors
from tritonlm.lora.store import LoraCacheFull, LoraStore
from tritonlm.worker.model_runner import ModelRunner

# The long one fills full KV blocks, so repeated prompts with other adapters meet the prefix cache.
PROMPTS = [[5, 17, 42, 99, 7, 3, 250, 31], [12, 13, 14], [(7 * i) % 500 + 3 for i in range(40)]]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {
        "all": make_adapter(model_dir, root / "all", seed=1),
        "attn": make_adapter(model_dir, root / "attn", seed=2, rank=4, targets=["q_proj", "v_proj"]),
    }


@pytest.fixture(scope="module")
def runner(attention_backend, model_dir) -> ModelRunner:
    return fp32_runner(model_dir, attention_backend, max_num_seqs=8, max_seq_len=256)


def test_peft_to_tensors_follows_tensorrt_llms_layout(adapters):
    weights, config = peft_to_tensors(adapters["attn"])
    state = load_file(adapters["attn"] / "adapter_model.safetensors")
    assert weights.dtype == np.float32 and config.dtype == np.int32
    assert config.shape == (2 * 4, 3)  # q and v of 4 layers
    assert set(config[:, 0]) == {MODULE_IDS["attn_q"], MODULE_IDS["attn_v"]}
    row = next(i for i, (m, layer, _) in enumerate(config) if m == MODULE_IDS["attn_v"] and layer == 2)
    a = state["base_model.model.model.layers.2.self_attn.v_proj.lora_A.weight"].numpy()
    b = state["base_model.model.model.layers.2.self_attn.v_proj.lora_B.weight"].numpy()
    scale = 8 / 4  # lora_alpha / r
    assert config[row].tolist() == [MODULE_IDS["attn_v"], 2, 4]
    expected = np.concatenate([a.reshape(-1), (b * scale).reshape(-1)])
    np.testing.assert_allclose(weights[row, : expected.size], expected, rtol=1e-6)
    assert not weights[row, expected.size :].any()  # zero padding up to the longest row (q's)


def test_mlp_mapping_is_the_converters(adapters):
    _, config = peft_to_tensors(adapters["all"])
    assert set(config[:, 0]) == set(range(1, 8))  # every id but the fused attn_qkv
    assert MODULE_IDS["mlp_h_to_4h"] == 5 and MODULE_IDS["mlp_gate"] == 7  # gate_proj, up_proj


def test_lora_modules_setting():
    assert parse_lora_modules(" a=/x , b.c=/y/z ") == {"a": "/x", "b.c": "/y/z"}
    for bad in ("a", "=x", "a=/x,a=/y", "bad name=/x", "None=/x"):
        with pytest.raises(ValueError):
            parse_lora_modules(bad)


def _store(runner, **settings) -> LoraStore:
    config = EngineConfig(runner.config.model_dir, **settings)
    return LoraStore(config, runner.lora.shapes, runner.dtype, runner.device)


def _task(task_id: int, adapter_dir=None) -> dict[str, np.ndarray]:
    tensors = {"lora_task_id": np.array([task_id], dtype=np.uint64)}
    if adapter_dir is not None:
        tensors["lora_weights"], tensors["lora_config"] = peft_to_tensors(adapter_dir)
    return tensors


def test_store_caches_by_task_id_and_evicts_the_least_recently_used(runner, adapters):
    store = _store(runner, lora_cache_max_adapters=2)
    with pytest.raises(InvalidRequest, match="LoRA task 7 not found in cache. Please send LoRA weights"):
        store.acquire(_task(7))
    first = store.acquire(_task(1, adapters["all"]))
    assert store.acquire(_task(1)) is first  # later requests send only the id
    store.release(first)
    store.release(first)
    store.release(store.acquire(_task(2, adapters["attn"])))
    store.release(store.acquire(_task(1)))  # 1 is now the most recently used
    store.release(store.acquire(_task(3, adapters["attn"])))
    assert store.cached_ids() == [1, 3]  # 2 went
    with pytest.raises(InvalidRequest, match="LoRA task 2 not found"):
        store.acquire(_task(2))


def test_store_never_evicts_an_adapter_in_use(runner, adapters):
    store = _store(runner, lora_cache_max_adapters=1)
    held = store.acquire(_task(1, adapters["attn"]))
    with pytest.raises(LoraCacheFull, match="overloaded"):
        store.acquire(_task(2, adapters["attn"]))
    assert store.acquire(_task(1)) is held
    store.release(held)
    store.release(held)
    store.release(store.acquire(_task(2, adapters["attn"])))
    assert store.cached_ids() == [2]


def test_store_bounds_bytes(runner, adapters):
    one = _store(runner).acquire(_task(1, adapters["attn"])).nbytes
    store = _store(runner, lora_cache_max_bytes=int(one * 1.5))
    store.release(store.acquire(_task(1, adapters["attn"])))
    store.release(store.acquire(_task(2, adapters["attn"])))
    assert store.cached_ids() == [2]
    with pytest.raises(InvalidRequest, match="lora_cache_max_bytes"):
        _store(runner, lora_cache_max_bytes=one // 2).acquire(_task(1, adapters["attn"]))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("lora_config"), "send both"),
        (lambda t: t.pop("lora_task_id"), "lora_task_id: required"),
        (lambda t: t["lora_config"].__setitem__((0, 0), 9), "module id 9"),
        (lambda t: t["lora_config"].__setitem__((0, 1), 99), "layer 99"),
        (lambda t: t["lora_config"].__setitem__((0, 2), 4000), "adapter_size 4000"),
        (lambda t: t.__setitem__("lora_config", t["lora_config"][:1]), "1 rows for 8 rows"),
        (lambda t: t["lora_weights"].__setitem__((0, 0), math.nan), "finite"),
        (lambda t: t.__setitem__("lora_name", np.array([b"x"], dtype=object)), "either lora_name"),
    ],
)
def test_bad_lora_tensors_are_refused_naming_the_tensor(runner, adapters, change, message):
    tensors = _task(1, adapters["attn"])
    change(tensors)
    with pytest.raises(InvalidRequest, match=message):
        _store(runner).acquire(tensors)


def test_named_adapters_load_at_start_up(runner, adapters):
    store = _store(runner, lora_modules=f"all={adapters['all']}")
    assert list(store.named) == ["all"]
    assert store.acquire({"lora_name": np.array([b"all"], dtype=object)}) is store.named["all"]
    with pytest.raises(InvalidRequest, match="no LoRA adapter named 'nope'.*all"):
        store.acquire({"lora_name": np.array([b"nope"], dtype=object)})
    with pytest.raises(ConfigError, match="lora_modules: adapter 'x'"):
        _store(runner, lora_modules="x=/nonexistent")


def test_mixed_adapters_in_one_batch_equal_the_merged_models(runner, adapters, model_dir):
    """Base and two adapters in the same steps (prompts staggered so prefills and decodes mix, each
    prompt with each adapter), each token for token equal to `generate` of the merged model."""
    store = _store(runner, lora_modules=f"all={adapters['all']},attn={adapters['attn']}")
    choices = [None, "all", "attn"]
    requests, expected = [], []
    for i, prompt in enumerate(PROMPTS * 3):
        name = choices[(i + i // 3) % 3]
        requests.append(request(prompt, NEW_TOKENS, lora=store.named[name] if name else None))
        expected.append(merged_generate(model_dir, adapters[name] if name else None, prompt, NEW_TOKENS))
    assert len({tuple(e) for e in expected[:3]}) == 3, "the adapters must change the output"
    _, seqs = run_all(runner, requests, stagger=True)
    for seq, want in zip(seqs, expected, strict=True):
        assert seq.output_ids == want, seq.request.lora and seq.request.lora.name


def test_fused_attn_qkv_rows_adapt_q_k_and_v(runner):
    """Module 0 (attn_qkv): one A for q, k and v; B's rows are q's, then k's, then v's."""
    from tritonlm.lora.adapter import build_adapter

    hidden = runner.lora.shapes[(0, "q_proj")][0]
    outs = [runner.lora.shapes[(0, p)][1] for p in ("q_proj", "k_proj", "v_proj")]
    a = np.arange(2 * hidden, dtype=np.float32).reshape(2, hidden)
    b = np.arange(sum(outs) * 2, dtype=np.float32).reshape(sum(outs), 2)
    row = np.concatenate([a.reshape(-1), b.reshape(-1)])[None]
    adapter = build_adapter(
        "t", row, np.array([[0, 1, 2]], np.int32), runner.lora.shapes, torch.float32, "cpu"
    )
    assert set(adapter.weights) == {(1, "q_proj"), (1, "k_proj"), (1, "v_proj")}
    np.testing.assert_array_equal(adapter.weights[(1, "k_proj")][0].numpy(), a)
    np.testing.assert_array_equal(adapter.weights[(1, "k_proj")][1].numpy(), b[outs[0] : outs[0] + outs[1]])


def test_a_malformed_lora_modules_setting_fails_as_a_setting():
    with pytest.raises(ConfigError, match="lora_modules: entry 'oops'"):
        EngineConfig.from_parameters({}, {"LORA_MODULES": "a=/x,oops"})
    assert EngineConfig.from_parameters({"lora_modules": "a=/x"}, {}).lora_modules == "a=/x"
