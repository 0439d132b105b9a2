"""Request priorities end to end, on a real tritonserver + frontend: every HTTP API takes `priority`
(refused, naming it, by an engine that schedules fcfs); under scheduling_policy priority with a KV
cache far too small for the load, interactive (priority -1) requests get their first token about as
fast as on an idle server, while the long low-priority streams are preempted and still finish with
the text they give alone."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import running_servers
from test_serving import engine_stat

# 24 blocks of 16 tokens: each low-priority stream ends up holding 14, so eight of them keep the
# cache full and preempt each other for the whole test.
SETTINGS = {
    "TRITONLM_SCHEDULING_POLICY": "priority",
    "TRITONLM_MAX_SEQ_LEN": "256",
    "TRITONLM_KV_CACHE_BLOCKS": "24",
}
LOW_STREAMS, LOW_TOKENS, LOW_PRIORITY = 8, 200, 10
HIGH_TOKENS, HIGH_PRIORITY = 8, -1
# What "about as fast as idle" allows: generous for a shared 2-CPU machine, far below the seconds a
# first-come-first-served queue behind the low-priority streams takes.
TTFT_FACTOR, TTFT_SLACK_S = 3.0, 1.5


@pytest.fixture(scope="module")
def priority_servers(model_dir) -> Iterator:
    with running_servers(model_dir, SETTINGS) as started:
        yield started


def completion(servers, prompt: str, max_tokens: int, priority: int) -> tuple[float, str]:
    """A greedy streamed completion: (seconds to its first token, its text)."""
    body = {
        "model": servers.model_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "priority": priority,
    }
    start, first, text = time.monotonic(), None, ""
    with httpx.stream("POST", servers.frontend_url + "/v1/completions", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            data = line.removeprefix("data: ")
            if not line.startswith("data: ") or data == "[DONE]":
                continue
            choices = json.loads(data)["choices"]
            if choices and choices[0]["text"]:
                first = first or time.monotonic() - start
                text += choices[0]["text"]
    assert first is not None
    return first, text


def test_interactive_requests_stay_fast_while_low_priority_work_is_preempted(priority_servers):
    servers = priority_servers
    high_prompts = [f"Question {i}: what is the capital of France?" for i in range(3)]
    low_prompts = [f"Write a long story number {i} about a lighthouse keeper." for i in range(LOW_STREAMS)]
    idle = [completion(servers, p, HIGH_TOKENS, HIGH_PRIORITY) for p in high_prompts]
    idle_ttft = statistics.median(t for t, _ in idle)
    preemptions_before = engine_stat(servers, "preemptions")

    low_results: dict[int, str] = {}

    def low(i: int) -> None:
        low_results[i] = completion(servers, low_prompts[i], LOW_TOKENS, LOW_PRIORITY)[1]

    threads = [threading.Thread(target=low, args=(i,)) for i in range(LOW_STREAMS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while engine_stat(servers, "preemptions") == preemptions_before:  # the cache is full
        assert time.monotonic() < deadline, "the low-priority streams never filled the KV cache"
        time.sleep(0.05)

    busy = [completion(servers, p, HIGH_TOKENS, HIGH_PRIORITY) for p in high_prompts]
    still_running = sum(thread.is_alive() for thread in threads)
    for thread in threads:
        thread.join(300)

    bound = TTFT_FACTOR * idle_ttft + TTFT_SLACK_S
    assert still_running, "the low-priority streams ended before the interactive requests: no saturation"
    assert all(t < bound for t, _ in busy), f"TTFT under load {[t for t, _ in busy]}, idle {idle_ttft}"
    assert [text for _, text in busy] == [text for _, text in idle]
    assert engine_stat(servers, "preemptions") > preemptions_before
    # Each low-priority stream, preempted or not, says what it says alone (no preemption then).
    assert len(low_results) == LOW_STREAMS
    alone_before = engine_stat(servers, "preemptions")
    for i, prompt in enumerate(low_prompts):
        assert completion(servers, prompt, LOW_TOKENS, LOW_PRIORITY)[1] == low_results[i]
    assert engine_stat(servers, "preemptions") == alone_before


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
        ("/", {"inputs": "Hi", "parameters": {"max_new_tokens": 2}}),
        ("/serving-endpoints/completions", {"prompt": "Hi", "max_tokens": 2}),
        ("/serving-endpoints/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 2}),
    ],
)
def test_every_api_takes_a_priority_and_an_fcfs_engine_refuses_one(servers, priority_servers, path, body):
    def send(target, priority: int) -> httpx.Response:
        if path == "/":
            payload = {**body, "parameters": {**body["parameters"], "priority": priority}}
        else:
            payload = {"model": target.model_name, **body, "priority": priority}
        return httpx.post(target.frontend_url + path, json=payload, timeout=60)

    assert send(priority_servers, -5).status_code == 200
    assert send(servers, 0).status_code == 200  # the default is every engine's
    refused = send(servers, 3)
    message = json.dumps(refused.json())
    if path == "/":  # TGI's status and shape
        assert refused.status_code == 422
    elif path == "/v1/messages":  # Anthropic's shape names no param: the message does
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    else:
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"
    assert "priority: only allowed with the engine's scheduling_policy priority" in message
    wrong_type = send(servers, "high")  # type: ignore[arg-type]
    assert wrong_type.status_code in (400, 422) and "priority" in wrong_type.text
