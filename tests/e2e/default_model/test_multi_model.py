"""Several generative models in one tritonserver (MODEL_DIRS), end to end: SmolLM2-135M-Instruct and
the tiny model served at once, interleaved concurrent requests on both each equal to that model's
own greedy output (transformers `generate`; test_real_model checks SmolLM2's more closely);
an unknown model named in a 404; and a model loaded, used, unloaded and loaded again at run time
through the admin routes while requests on the other models keep running, none failing."""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import Servers

from . import ADMIN, USER

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
NEW_TOKENS = 8


def complete(servers: Servers, model: str, prompt: str, max_tokens: int = NEW_TOKENS) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{servers.frontend_url}/v1/completions", json=body, headers=USER, timeout=300)


def text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


@functools.cache
def checkpoint(model_dir: Path) -> tuple:
    return AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32
    )


def greedy(model_dir: Path, prompt: str) -> str:
    """The checkpoint's own greedy continuation (float32 transformers), as text."""
    tokenizer, model = checkpoint(model_dir)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_both_models_are_listed(two, gguf_files) -> None:
    servers, dirs = two
    ids = [m["id"] for m in httpx.get(f"{servers.frontend_url}/v1/models", headers=USER).json()["data"]]
    assert ids[:-1] == [*dirs, *gguf_files]  # MODEL_DIRS' order, the default first (a GGUF file by name)
    assert len(ids) == len(dirs) + len(gguf_files) + 1  # and the embedding model


def test_interleaved_requests_equal_each_model_alone(two) -> None:
    servers, dirs = two
    jobs = [(name, prompt) for prompt in PROMPTS for name in dirs]  # interleaved: smollm2, tiny, ...
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: text(complete(servers, *job)), jobs))
    for (name, prompt), served in zip(jobs, got, strict=True):
        assert served == greedy(dirs[name], prompt), (name, prompt)


def test_an_unknown_model_is_a_404_listing_the_served_ones(two) -> None:
    servers, _ = two
    response = complete(servers, "nope", "Hi")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["param"] == "model" and error["code"] == "model_not_found"
    assert "'nope'" in error["message"] and "'smollm2'" in error["message"] and "'tiny'" in error["message"]


def test_model_routes_need_the_admin_key(two) -> None:
    servers, dirs = two
    url = f"{servers.frontend_url}/v1/models/extra/load"
    body = {"model_dir": str(dirs["tiny"])}
    assert httpx.post(url, json=body, headers=USER).status_code == 401  # an API key is not enough
    assert httpx.post(url, json=body).status_code == 401
    outside = httpx.post(url, json={"model_dir": "/etc"}, headers=ADMIN)
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "model_dir"
    unload = httpx.post(f"{servers.frontend_url}/v1/models/smollm2/unload", headers=ADMIN)
    assert unload.status_code == 400 and "default model" in unload.json()["error"]["message"]


class Traffic:
    """Greedy requests on the served models, round after round, until stopped; every answer kept."""

    def __init__(self, servers: Servers, models: list[str]) -> None:
        self.servers, self.models = servers, models
        self.statuses: list[int] = []
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(m,)) for m in models]

    def _run(self, model: str) -> None:
        while not self.stopped.wait(0.2):  # steady, leaving the 2 CPU cores room to load models
            self.statuses.append(complete(self.servers, model, "Once upon a time", 4).status_code)

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def load(servers: Servers, name: str, model_dir: Path) -> httpx.Response:
    url = f"{servers.frontend_url}/v1/models/{name}/load"
    return httpx.post(url, json={"model_dir": str(model_dir)}, headers=ADMIN, timeout=600)


def test_load_use_unload_reload_under_load(two) -> None:
    servers, dirs = two
    expected = text(complete(servers, "tiny", PROMPTS[0]))
    with Traffic(servers, list(dirs)) as traffic, ThreadPoolExecutor(2) as pool:
        loading = pool.submit(load, servers, "extra", dirs["tiny"])
        retry = None
        while not loading.done():  # while it loads: 503 with Retry-After
            response = complete(servers, "extra", "Hi")
            if response.status_code == 503:
                retry = response
                break
            time.sleep(0.05)
        assert loading.result().status_code == 200, loading.result().text
        assert retry is not None and retry.headers["retry-after"] and "loading" in retry.text
        assert text(complete(servers, "extra", PROMPTS[0])) == expected  # the same checkpoint

        running = pool.submit(complete, servers, "extra", PROMPTS[1], 48)
        time.sleep(0.5)  # it is generating when the unload comes; unloading lets it finish
        unload = httpx.post(f"{servers.frontend_url}/v1/models/extra/unload", headers=ADMIN, timeout=300)
        assert unload.status_code == 200, unload.text
        assert running.result().status_code == 200
        assert complete(servers, "extra", "Hi").status_code == 404

        assert load(servers, "extra", dirs["tiny"]).status_code == 200
        assert text(complete(servers, "extra", PROMPTS[0])) == expected
    assert traffic.statuses and set(traffic.statuses) == {200}, traffic.statuses
