"""End to end: Databricks model serving: the chat and completions tasks of
`POST /serving-endpoints/{name}/invocations`, and the `openai` SDK with `base_url=.../serving-endpoints`.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

pytestmark = pytest.mark.usefixtures("servers")

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is a mixture of experts model?"},
]


def invoke(servers, name: str, body: dict) -> httpx.Response:
    return httpx.post(f"{servers.frontend_url}/serving-endpoints/{name}/invocations", json=body, timeout=60)


def test_chat_task(servers):
    r = invoke(servers, servers.model_name, {"messages": MESSAGES, "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "chat.completions" and body["model"] == servers.model_name
    [choice] = body["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_chat_task_streams(servers):
    body = {"messages": MESSAGES, "max_tokens": 5, "temperature": 0, "stream": True, "n": 2}
    with httpx.stream(
        "POST",
        f"{servers.frontend_url}/serving-endpoints/{servers.model_name}/invocations",
        json=body,
        timeout=60,
    ) as r:
        assert r.status_code == 200
        data = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    finished = [c["index"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert sorted(finished) == [0, 1]
    usage = events[-1]["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert 2 <= usage["completion_tokens"] <= 10


def test_completions_task_with_a_list_of_prompts(servers):
    body = {
        "prompt": ["Hello", "The sky is"],
        "max_tokens": 4,
        "n": 2,
        "temperature": 0.5,
        "echo": True,
        "suffix": "!",
    }
    r = invoke(servers, servers.model_name, body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion"
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    for choice in out["choices"]:
        assert set(choice) == {"index", "text", "finish_reason"}
        prompt = body["prompt"][choice["index"] // 2]
        assert choice["text"].startswith(prompt) and choice["text"].endswith("!")
    assert out["usage"]["completion_tokens"] == 16
    single = invoke(servers, servers.model_name, {"prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert len(single.json()["choices"]) == 1


def test_error_behavior_truncate(servers):
    long = "word " * 3000  # more than the model's context
    r = invoke(servers, servers.model_name, {"prompt": long, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    body = {"prompt": long, "max_tokens": 4, "temperature": 0, "error_behavior": "truncate"}
    r = invoke(servers, servers.model_name, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": MESSAGES, "temperature": 2.5}, "temperature"),
        ({"messages": MESSAGES, "top_p": 0}, "top_p"),
        ({"messages": MESSAGES, "top_k": 0}, "top_k"),
        ({"messages": MESSAGES, "n": 0}, "n"),
        ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": MESSAGES, "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"messages": MESSAGES, "model": "x"}, "model"),  # the endpoint name selects the model
        ({"prompt": "Hi", "error_behavior": "ignore"}, "error_behavior"),
        ({"prompt": [], "max_tokens": 2}, "prompt"),
        ({"prompt": "Hi", "use_raw_prompt": 1}, "use_raw_prompt"),
        ({"prompt": "Hi", "logprobs": 1}, "logprobs"),
        ({"temperature": 1}, None),  # no task: neither messages, prompt nor input
    ],
)
def test_bad_requests_are_400(servers, body, param):
    r = invoke(servers, servers.model_name, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param


def test_unknown_endpoint_is_404(servers):
    r = invoke(servers, "no-such-endpoint", {"messages": MESSAGES})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_embeddings_task_is_dispatched(servers):
    embed = next(
        m["id"]
        for m in httpx.get(servers.frontend_url + "/v1/models").json()["data"]
        if m["id"] != servers.model_name
    )
    r = invoke(servers, embed, {"input": ["Hello", "world"]})
    assert r.status_code == 200, r.text
    assert [d["index"] for d in r.json()["data"]] == [0, 1]


def test_openai_sdk_against_serving_endpoints(servers):
    client = openai.OpenAI(base_url=servers.frontend_url + "/serving-endpoints", api_key="x", max_retries=0)
    chat = client.chat.completions.create(
        model=servers.model_name, messages=MESSAGES, max_tokens=4, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens >= 1
    stream = client.chat.completions.create(
        model=servers.model_name, messages=MESSAGES, max_tokens=4, temperature=0, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        == chat.choices[0].message.content
    )
    completion = client.completions.create(
        model=servers.model_name, prompt="Hello", max_tokens=3, temperature=0
    )
    assert completion.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="Hello", max_tokens=3)
