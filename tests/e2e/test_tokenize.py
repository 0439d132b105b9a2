"""vLLM's `POST /tokenize` and `POST /detokenize` on a real tritonserver and frontend: the counts
equal what the chat and completion routes report as `usage.prompt_tokens`, ids round-trip, and bad
requests are 400s in OpenAI's shape naming the field."""

from __future__ import annotations

import httpx
import pytest

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is machine learning?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def post(servers, route: str, body: dict) -> httpx.Response:
    return httpx.post(servers.frontend_url + route, json=body, timeout=60)


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS}], ids=["chat", "chat with tools"])
def test_a_chats_count_is_its_prompt_tokens(servers, extra):
    tokenized = ok(post(servers, "/tokenize", {"model": servers.model_name, "messages": CHAT, **extra}))
    chat = {"model": servers.model_name, "messages": CHAT, "max_tokens": 1, **extra}
    usage = ok(post(servers, "/v1/chat/completions", chat))["usage"]
    assert tokenized["count"] == len(tokenized["tokens"]) == usage["prompt_tokens"]
    assert tokenized["max_model_len"] > tokenized["count"]


def test_a_prompts_tokens_and_their_texts(servers):
    body = {"model": servers.model_name, "prompt": "Hello world", "return_token_strs": True}
    tokenized = ok(post(servers, "/tokenize", body))
    completion = {"model": servers.model_name, "prompt": "Hello world", "max_tokens": 1}
    assert tokenized["count"] == ok(post(servers, "/v1/completions", completion))["usage"]["prompt_tokens"]
    assert "".join(tokenized["token_strs"]) == "Hello world"
    assert "token_strs" not in ok(post(servers, "/tokenize", {"prompt": "Hello world"}))


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": TOOLS}, {"functions": [TOOLS[0]["function"]], "reasoning_effort": "none"}],
    ids=["chat", "chat with tools", "chat with functions, thinking off"],
)
def test_a_rendered_chat_is_what_generation_sees(servers, extra):
    body = {"model": servers.model_name, "messages": CHAT, "max_tokens": 1, **extra}
    rendered = ok(post(servers, "/v1/chat/completions/render", body))
    usage = ok(post(servers, "/v1/chat/completions", body))["usage"]
    assert len(rendered["token_ids"]) == usage["prompt_tokens"]
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["model"] == servers.model_name
    # /tokenize of the same chat: functions are tools, reasoning_effort none the template's switch off.
    tokens = {"model": servers.model_name, "messages": CHAT}
    if extra:
        tokens["tools"] = TOOLS
    if "reasoning_effort" in extra:
        tokens["chat_template_kwargs"] = {"enable_thinking": False}
    assert rendered["token_ids"] == ok(post(servers, "/tokenize", tokens))["tokens"]
    assert "What is machine learning?" in rendered["prompt"]
    assert ("get_weather" in rendered["prompt"]) == bool(extra)


def test_a_rendered_prompt_is_what_generation_sees(servers):
    body = {"model": servers.model_name, "prompt": "Hello world", "max_tokens": 1}
    [rendered] = ok(post(servers, "/v1/completions/render", body))
    usage = ok(post(servers, "/v1/completions", body))["usage"]
    assert rendered["token_ids"] == ok(post(servers, "/tokenize", {"prompt": "Hello world"}))["tokens"]
    assert len(rendered["token_ids"]) == usage["prompt_tokens"] and rendered["prompt"] == "Hello world"


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"1000000": 1}}),
        ("/v1/chat/completions", {"messages": CHAT, "verbosity": "low"}),
        ("/v1/completions", {"prompt": "hello " * 3000}),  # longer than the context
    ],
)
def test_render_refuses_what_generation_refuses(servers, route, body):
    body = {"model": servers.model_name, **body}
    generated, rendered = post(servers, route, body), post(servers, route + "/render", body)
    assert generated.status_code == rendered.status_code == 400
    assert rendered.json() == generated.json()


def test_detokenize_round_trips(servers):
    tokens = ok(post(servers, "/tokenize", {"prompt": "Hello world, 你好"}))["tokens"]
    assert ok(post(servers, "/detokenize", {"model": servers.model_name, "tokens": tokens})) == {
        "prompt": "Hello world, 你好"
    }


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/tokenize", {"prompt": "x", "messages": CHAT}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "x", "tools": TOOLS}, "tools"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": False}, "add_special_tokens"),
        ("/tokenize", {"messages": CHAT, "add_generation_prompt": False}, "add_generation_prompt"),
        ("/tokenize", {"messages": CHAT, "add_special_tokens": True}, "add_special_tokens"),
        ("/tokenize", {"prompt": "x", "continue_final_message": True}, "continue_final_message"),
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/detokenize", {"tokens": [1, 10**7]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {}, "tokens"),
    ],
)
def test_bad_requests_name_the_field(servers, route, body, param):
    response = post(servers, route, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_an_unknown_model_is_404(servers):
    response = post(servers, "/tokenize", {"model": "nope", "prompt": "x"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
