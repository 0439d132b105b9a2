"""LoRA adapters loaded at run time, end to end: one tritonserver + frontend with the admin routes
(ADMIN_API_KEY), API keys, LORA_ALLOWED_DIRS, a start-up adapter to compare with, and a LoRA cache of
one task (so the engine forgets run-time adapters and the frontend must send them again)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import MAX_QUEUE_SIZE, running_servers
from lora_helpers import make_adapter
from test_lora_serving import generate, task

ADMIN, KEY = "admin-secret", "user-key"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def runtime(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-runtime")
    allowed = root / "allowed"
    adapter = make_adapter(model_dir, root / "startup", seed=21, rank=4)
    shutil.copytree(adapter, allowed / "same")  # the start-up adapter's copy, to load at run time
    make_adapter(model_dir, root / "outside", seed=22, rank=2)
    settings = {
        "TRITONLM_MAX_QUEUE_SIZE": str(MAX_QUEUE_SIZE),
        "LORA_MODULES": f"startup={adapter}",
        "TRITONLM_LORA_CACHE_MAX_ADAPTERS": "1",
        "ADMIN_API_KEY": ADMIN,
        "API_KEY": KEY,
        "LORA_ALLOWED_DIRS": str(allowed),
    }
    with running_servers(model_dir, settings) as servers:
        servers.root, servers.allowed = root, allowed
        yield servers


def admin(servers, path: str, body: dict, key: str | None = ADMIN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(servers.frontend_url + path, json=body, headers=headers, timeout=120)


def chat(servers, model: str) -> httpx.Response:
    url, headers = servers.frontend_url + "/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}
    return httpx.post(url, json={**CHAT, "model": model}, headers=headers, timeout=60)


def models(servers) -> dict[str, dict]:
    r = httpx.get(servers.frontend_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    return {card["id"]: card for card in r.json()["data"]}


def test_load_use_unload_while_streaming_and_reload(runtime):
    same = str(runtime.allowed / "same")
    r = admin(runtime, LOAD, {"lora_name": "rt", "lora_path": same})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'rt' added successfully.", r.text
    card = models(runtime)["rt"]
    assert card["parent"] == runtime.model_name and card["root"] == str((runtime.allowed / "same").resolve())
    expected = chat(runtime, "startup").json()["choices"][0]["message"]["content"]
    assert expected != chat(runtime, runtime.model_name).json()["choices"][0]["message"]["content"]
    r = chat(runtime, "rt")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == expected, r.text
    # A gRPC task takes the engine's one cache slot: the next request with rt must bring its weights.
    generate(runtime, task(7, runtime.root / "outside"))
    assert chat(runtime, "rt").json()["choices"][0]["message"]["content"] == expected

    # Unloading while a stream runs: the stream completes, the unload answers after its last token.
    started, seen = threading.Event(), {}
    body = {"model": "rt", "prompt": "Once", "max_tokens": 300, "min_tokens": 300, "stream": True}

    def stream():
        headers = {"Authorization": f"Bearer {KEY}"}
        url = runtime.frontend_url + "/v1/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as r:
            seen["lines"] = lines = []
            for line in r.iter_lines():
                started.set()
                lines.append(line)
                if '"finish_reason":"length"' in line.replace(" ", ""):
                    seen["finished_at"] = time.monotonic()

    streamer = threading.Thread(target=stream)
    streamer.start()
    assert started.wait(60)
    assert "finished_at" not in seen  # still running when the unload starts
    r = admin(runtime, UNLOAD, {"lora_name": "rt"})
    unloaded_at = time.monotonic()
    streamer.join(120)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'rt' removed successfully.", r.text
    events = [line for line in seen["lines"] if line]
    assert events[-1] == "data: [DONE]" and "finished_at" in seen, events[-3:]
    assert unloaded_at > seen["finished_at"] - 1.0  # (the client's two threads read at their own pace)
    r = chat(runtime, "rt")
    assert r.status_code == 404 and "'rt'" in r.json()["error"]["message"], r.text
    assert "rt" not in models(runtime)
    r = admin(runtime, LOAD, {"lora_name": "rt", "lora_path": same})
    assert r.status_code == 200, r.text
    assert chat(runtime, "rt").json()["choices"][0]["message"]["content"] == expected
    assert admin(runtime, UNLOAD, {"lora_name": "rt"}).status_code == 200


def test_refusals(runtime):
    same = str(runtime.allowed / "same")
    (runtime.allowed / "empty").mkdir(exist_ok=True)
    for body, status, param, words in (
        ({"lora_name": "x", "lora_path": str(runtime.root / "outside")}, 400, "lora_path", "outside"),
        ({"lora_name": "x", "lora_path": f"{same}/../../outside"}, 400, "lora_path", "outside"),
        ({"lora_name": "x", "lora_path": str(runtime.allowed / "empty")}, 400, "lora_path", "not a PEFT"),
        ({"lora_name": "startup", "lora_path": same}, 400, "lora_name", "has already been loaded"),
    ):
        r = admin(runtime, LOAD, body)
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"], r.text
    r = admin(runtime, UNLOAD, {"lora_name": "nope"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "The lora adapter 'nope' cannot be found."
    assert admin(runtime, UNLOAD, {"lora_name": "startup"}).status_code == 400
    for key in (None, "wrong", KEY):  # missing, wrong, an ordinary API key
        assert admin(runtime, LOAD, {"lora_name": "x", "lora_path": same}, key=key).status_code == 401
    assert "x" not in models(runtime)
    assert chat(runtime, runtime.model_name).status_code == 200
    r = httpx.post(
        runtime.frontend_url + "/v1/chat/completions",
        json={**CHAT, "model": runtime.model_name},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code == 401  # the admin key is no API key


def test_fuzzing_the_admin_routes_finds_no_server_error_and_no_undocumented_status(runtime, tmp_path):
    """test_ops.py's bounded schemathesis run, on the admin routes (absent from its servers)."""
    st = Path(sys.executable).parent / "st"
    command = [
        str(st), "run", f"{runtime.frontend_url}/openapi.json",
        "--include-path-regex", "lora_adapter", "-H", f"Authorization: Bearer {ADMIN}",
        "--checks", "not_a_server_error,status_code_conformance",
        "--max-examples", "25", "--workers", "2", "--request-timeout", "120", "--seed", "20261124",
        "--no-color",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "passed" in run.stdout, run.stdout[-2000:]
