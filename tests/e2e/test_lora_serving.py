"""LoRA end to end: one tritonserver + frontend session with two adapters by name (LORA_MODULES) and
a LoRA cache of two tasks; TensorRT-LLM's tensors over gRPC, names over every HTTP API, mixed
batches, eviction, and fidelity against transformers' merged PEFT model."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from conftest import MAX_QUEUE_SIZE, running_servers
from lora_helpers import make_adapter, merged_generate
from prometheus_client.parser import text_string_to_metric_families

from client import lora as lora_files
from client.stream import StreamClient
from tritonlm.lora.format import peft_to_tensors

PROMPT = [5, 17, 42, 99, 7, 3, 250, 31, 8, 64, 77, 12, 19, 23, 29, 31, 37, 41]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def lora(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-serving")
    adapters = {
        "alpha": make_adapter(model_dir, root / "alpha", seed=11),
        "beta": make_adapter(
            model_dir, root / "beta", seed=12, rank=4, targets=["q_proj", "v_proj", "down_proj"]
        ),
        "gamma": make_adapter(model_dir, root / "gamma", seed=13, rank=2),  # only ever sent as tensors
    }
    settings = {
        "TRITONLM_MAX_QUEUE_SIZE": str(MAX_QUEUE_SIZE),
        "LORA_MODULES": f"alpha={adapters['alpha']},beta={adapters['beta']}",
        "TRITONLM_LORA_CACHE_MAX_ADAPTERS": "2",
    }
    with running_servers(model_dir, settings) as servers:
        servers.adapters = adapters
        yield servers


def generate(servers, values: dict, model: str = "engine") -> dict:
    """The last response of one request (streaming off: the only one)."""
    if model == "engine":
        values = {"input_ids": PROMPT, "request_output_len": NEW_TOKENS, **values}
    client = StreamClient(servers.grpc_url)
    try:
        return list(client.generate(model, values))[-1]
    finally:
        client.close()


def output_ids(servers, values: dict) -> list[int]:
    return generate(servers, values)["output_ids"].reshape(-1).tolist()


def task(task_id: int, adapter_dir=None) -> dict:
    values: dict = {"lora_task_id": np.uint64(task_id)}
    if adapter_dir is not None:
        values["lora_weights"], values["lora_config"] = peft_to_tensors(adapter_dir)
    return values


def test_tensors_then_id_alone_equal_the_merged_model(lora, model_dir, tmp_path):
    # The converter's files, as a gRPC user would send them.
    assert lora_files.main([str(lora.adapters["gamma"]), str(tmp_path)]) == 0
    weights, config = lora_files.load(tmp_path)
    expected = merged_generate(model_dir, lora.adapters["gamma"], PROMPT, NEW_TOKENS)
    assert expected != merged_generate(model_dir, None, PROMPT, NEW_TOKENS)
    first = {"lora_task_id": np.uint64(1), "lora_weights": weights, "lora_config": config}
    assert output_ids(lora, first) == expected
    assert output_ids(lora, task(1)) == expected  # cached by id


def test_unknown_task_id_gets_tensorrt_llms_error(lora):
    with pytest.raises(RuntimeError, match="LoRA task 424242 not found in cache. Please send LoRA weights"):
        output_ids(lora, task(424242))


def test_mixed_adapters_share_steps_and_each_equals_its_merged_model(lora, model_dir):
    plans = [
        ({}, None),
        ({"lora_name": np.array([b"alpha"], dtype=object)}, "alpha"),
        ({"lora_name": np.array([b"beta"], dtype=object)}, "beta"),
        (task(2, lora.adapters["gamma"]), "gamma"),
    ] * 2
    expected = {
        name: merged_generate(model_dir, lora.adapters[name] if name else None, PROMPT, NEW_TOKENS)
        for name in (None, "alpha", "beta", "gamma")
    }
    with ThreadPoolExecutor(len(plans)) as pool:
        outputs = list(pool.map(lambda plan: generate(lora, plan[0]), plans))
    for (_, name), output in zip(plans, outputs, strict=True):
        assert output["output_ids"].reshape(-1).tolist() == expected[name], name
    assert max(int(o["batch_size"].max()) for o in outputs) > 1  # they did share steps


def test_eviction_under_a_small_cache(lora):
    """Two tasks fit (TRITONLM_LORA_CACHE_MAX_ADAPTERS=2): a third evicts the least recently used."""
    gamma = lora.adapters["gamma"]
    for task_id in (31, 32):
        output_ids(lora, task(task_id, gamma))
    output_ids(lora, task(31))  # 31 used last: 32 is the oldest
    output_ids(lora, task(33, gamma))
    output_ids(lora, task(31))
    with pytest.raises(RuntimeError, match="LoRA task 32 not found in cache"):
        output_ids(lora, task(32))


def test_adapters_are_listed_with_their_parent(lora):
    cards = {m["id"]: m for m in httpx.get(lora.frontend_url + "/v1/models").json()["data"]}
    assert cards["alpha"]["parent"] == cards["beta"]["parent"] == lora.model_name
    assert "parent" not in cards[lora.model_name]


def _completion(lora, model: str) -> str:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    r = httpx.post(lora.frontend_url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return r.json()["choices"][0]["text"]


def test_every_http_api_selects_an_adapter_by_name(lora):
    base, alpha = _completion(lora, lora.model_name), _completion(lora, "alpha")
    assert alpha != base and _completion(lora, "beta") not in (base, alpha)
    # TGI: parameters.adapter_id; the same prompt and greedy settings give the same text.
    tgi = {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 8, "adapter_id": "alpha"}}
    r = httpx.post(lora.frontend_url + "/", json=tgi, timeout=60)
    assert r.status_code == 200 and r.json()[0]["generated_text"] == alpha, r.text
    # Databricks: the endpoint name.
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{lora.frontend_url}/serving-endpoints/alpha/invocations", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == alpha, r.text
    # gRPC text clients: the ensemble takes lora_name (and the task tensors) too.
    values = {"text_input": ["Once upon a time"], "max_tokens": 8, "lora_name": np.array([b"alpha"], object)}
    assert generate(lora, values, model="ensemble")["text_output"][0].decode() == alpha
    # Chat, OpenAI's and Databricks', with the adapter and without.
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    texts = {}
    for model in ("alpha", lora.model_name):
        r = httpx.post(lora.frontend_url + "/v1/chat/completions", json={**chat, "model": model}, timeout=60)
        assert r.status_code == 200, r.text
        texts[model] = r.json()["choices"][0]["message"]["content"]
    assert texts["alpha"] != texts[lora.model_name]
    r = httpx.post(f"{lora.frontend_url}/serving-endpoints/alpha/invocations", json=chat, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == texts["alpha"]


def test_unknown_adapters_get_4xx_naming_the_field(lora):
    body = {"model": "nope", "prompt": "Hi", "max_tokens": 2}
    r = httpx.post(lora.frontend_url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text
    tgi = {"inputs": "Hi", "parameters": {"adapter_id": "nope"}}
    r = httpx.post(lora.frontend_url + "/", json=tgi, timeout=60)
    assert r.status_code == 422 and "parameters.adapter_id" in r.json()["error"], r.text
    assert "alpha" in r.json()["error"]
    r = httpx.post(
        f"{lora.frontend_url}/serving-endpoints/nope/invocations", json={"prompt": "Hi"}, timeout=60
    )
    assert r.status_code == 404, r.text
    with pytest.raises(RuntimeError, match="lora_name: no LoRA adapter named 'nope'"):
        output_ids(lora, {"lora_name": np.array([b"nope"], dtype=object)})


def lora_info(servers) -> dict[str, str]:
    """The labels of the frontend's vllm:lora_requests_info (what gateways read for adapter affinity)."""
    text = httpx.get(servers.frontend_url + "/metrics", timeout=30).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info")
    return next(s.labels for s in family.samples if s.labels["model_name"] == servers.model_name)


def test_the_lora_info_gateways_read_lists_an_adapter_while_it_runs(lora):
    stop = threading.Event()

    def stream() -> None:
        body = {"model": "beta", "prompt": "Hi", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", lora.frontend_url + "/v1/completions", json=body, timeout=120) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return  # closed: the engine cancels it

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while (labels := lora_info(lora))["running_lora_adapters"] != "beta":
            assert time.monotonic() < deadline, f"beta never listed: {labels}"
            time.sleep(0.2)
        assert labels["max_lora"] == "4"  # the two named adapters and a cache of two tasks
    finally:
        stop.set()
        thread.join(60)
    deadline = time.monotonic() + 60
    while (labels := lora_info(lora))["running_lora_adapters"]:
        assert time.monotonic() < deadline, f"beta still listed: {labels}"
        time.sleep(0.2)
