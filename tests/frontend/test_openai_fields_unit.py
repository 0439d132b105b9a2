"""OpenAI's documented request fields on chat completions and completions, without Triton: those
accepted with no effect, those refused with what to send instead, logit_bias (checked, then the
engine's embedding_bias), reasoning_effort's thinking switch, the deprecated functions/function_call
(as tools, the reply's call as function_call), and the render routes' prompt ids, against a fake
Triton."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_frontend_unit import FakeTriton, response, sent_inputs
from test_openai_unit import MESSAGES, chat, client, completion

from frontend.chat_tools.reasoning import effort_kwargs
from frontend.errors import APIError
from frontend.openai_api import routes
from frontend.openai_api.fields import embedding_bias
from frontend.openai_api.schema import ChatCompletionRequest, CompletionRequest
from frontend.tokenize import render

VOCAB = 32000  # above the fake preprocessing's ids
NO_EFFECT = {
    "user": "u-1",
    "metadata": {"team": "search"},
    "service_tier": "flex",
    "prompt_cache_key": "k",
    "safety_identifier": "hashed",
    "store": False,
}
FUNCTION = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(autouse=True)
def vocab(monkeypatch):
    """The model's vocabulary size, which the routes read from its checkpoint (none here)."""

    async def vocab_size(request, served=None):
        return VOCAB

    monkeypatch.setattr(routes, "vocab_size", vocab_size)
    monkeypatch.setattr(render, "vocab_size", vocab_size)


def error(r) -> tuple[str, str]:
    assert r.status_code == 400, r.text
    return r.json()["error"]["param"], r.json()["error"]["message"]


# ---------------------------------------------------------------------------------------------
# Accepted with no effect; refused with what to send instead.


def test_fields_with_no_effect_change_nothing_sent():
    for send in (chat, completion):
        plain, with_fields = FakeTriton(), FakeTriton()
        assert send(plain, max_tokens=3).status_code == 200
        assert send(with_fields, max_tokens=3, **NO_EFFECT).status_code == 200
        assert sent_inputs(with_fields).keys() == sent_inputs(plain).keys()
    assert chat(FakeTriton(), modalities=["text"]).status_code == 200
    assert chat(FakeTriton(), **dict.fromkeys(NO_EFFECT)).status_code == 200  # null: not given


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"store": True}, "store", "send false"),
        ({"metadata": {"k": 1}}, "metadata", "string values"),
        ({"service_tier": "gold"}, "service_tier", "flex"),
        ({"modalities": ["text", "audio"]}, "modalities", '["text"]'),
        ({"verbosity": "low"}, "verbosity", "max_completion_tokens"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction", "leave it out"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "text only"),
        ({"web_search_options": {}}, "web_search_options", "tools"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation", "leave it out"),
        ({"prompt_cache_retention": "24h"}, "prompt_cache_retention", "prompt_cache_key"),
        ({"prompt_cache_options": {"ttl": "30m"}}, "prompt_cache_options", "automatic"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort", "minimal"),
    ],
)
def test_chat_fields_not_served_are_400s_that_say_what_to_send(body, param, says):
    got_param, message = error(chat(FakeTriton(), **body))
    assert got_param == param and says in message


def test_completion_suffix_is_refused_and_chat_only_fields_are_unknown():
    assert error(completion(FakeTriton(), suffix="end")) == (
        "suffix",
        "suffix: not supported by this server; leave it out (no fill-in-the-middle: the completion follows "
        "the prompt)",
    )
    assert "unknown field" in error(completion(FakeTriton(), verbosity="low"))[1]


# ---------------------------------------------------------------------------------------------
# logit_bias


def test_logit_bias_reaches_the_engine_as_its_embedding_bias():
    fake = FakeTriton()
    assert chat(fake, logit_bias={"5": -100, "7": 2.5}).status_code == 200
    bias = sent_inputs(fake)["embedding_bias"]
    assert bias.shape == (1, VOCAB) and bias.dtype == np.float32
    expected = np.zeros(VOCAB, dtype=np.float32)
    expected[5], expected[7] = -100, 2.5
    assert np.array_equal(bias[0], expected)
    fake = FakeTriton()
    assert completion(fake, logit_bias={}).status_code == 200  # empty: nothing to add
    assert "embedding_bias" not in sent_inputs(fake)


@pytest.mark.parametrize(
    ("bias", "says"),
    [
        ({"32000": 1}, "token ids must be in [0, 31999] (the model's vocabulary), got 32000"),
        ({"5": 101}, "biases must be numbers in [-100, 100], got 101 for 5"),
        ({"5": -100.5}, "biases must be numbers in [-100, 100]"),
        ({"5": True}, "biases must be numbers"),
        ({"five": 1}, "keys must be token ids written as strings of digits, got 'five'"),
        ({"-1": 1}, "keys must be token ids"),
        ([1, 2], "must be an object of token ids to biases"),
    ],
)
def test_bad_logit_bias_is_a_400_naming_it(bias, says):
    for send in (chat, completion):
        param, message = error(send(FakeTriton(), logit_bias=bias))
        assert param == "logit_bias" and says in message, message


def test_embedding_bias_without_a_vocab_size():
    with pytest.raises(APIError, match="names no vocab_size"):
        embedding_bias({1: 1.0}, None)


# ---------------------------------------------------------------------------------------------
# reasoning_effort


def job(**body):
    return ChatCompletionRequest(model="m", **{"messages": MESSAGES, **body})


def test_reasoning_effort_is_the_thinking_switch():
    for effort, thinking in (
        ("none", False),
        ("minimal", False),
        ("low", True),
        ("high", True),
        ("max", True),
    ):
        assert job(reasoning_effort=effort).to_job("think").chat_template_kwargs == {
            "enable_thinking": thinking
        }
        assert effort_kwargs(effort, "none") == {}  # a model that does not reason: accepted, unchanged
        assert job(reasoning_effort=effort).to_job("none").chat_template_kwargs is None
    kwargs = {"enable_thinking": False, "x": 1}
    assert job(reasoning_effort="none", chat_template_kwargs=kwargs).to_job().chat_template_kwargs == kwargs
    with pytest.raises(APIError, match="reasoning_effort: 'high' sets enable_thinking true, but"):
        job(reasoning_effort="high", chat_template_kwargs=kwargs).to_job()


def test_reasoning_effort_reaches_the_template():
    fake = FakeTriton()
    assert chat(fake, reasoning_effort="none").status_code == 200
    assert json.loads(sent_inputs(fake)["chat_template_kwargs"][0]) == {"enable_thinking": False}


# ---------------------------------------------------------------------------------------------
# The deprecated functions / function_call


def test_functions_are_tools_with_one_call_a_reply():
    spec = job(functions=[FUNCTION]).to_job().tools
    assert spec.legacy and not spec.parallel and spec.choice == "auto"
    assert spec.template_tools() == [{"type": "function", "function": FUNCTION}]
    named = job(functions=[FUNCTION], function_call={"name": "get_weather"}).to_job().tools
    assert named.choice == "function" and named.name == "get_weather"
    assert job(functions=[FUNCTION], function_call="none").to_job().tools is None


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (
            {"functions": [FUNCTION], "tools": [{"type": "function", "function": FUNCTION}]},
            "functions",
            "not both",
        ),
        (
            {"functions": [FUNCTION], "function_call": "auto", "tool_choice": "auto"},
            "function_call",
            "not both",
        ),
        ({"function_call": "auto"}, "function_call", "needs functions"),
        ({"functions": [FUNCTION], "function_call": {"name": "f"}}, "function_call", "not in functions"),
        ({"functions": [FUNCTION], "function_call": "required"}, "function_call", '{"name": "..."}'),
        ({"functions": [FUNCTION], "parallel_tool_calls": True}, "parallel_tool_calls", "one call"),
    ],
)
def test_bad_legacy_functions(body, param, says):
    got_param, message = error(chat(FakeTriton(), **body))
    assert got_param == param and says in message, message


def call_reply() -> list:
    return [response([(1, CALL_TEXT, -0.1, False)], finish="end_id")]


def test_a_functions_reply_names_its_call_function_call():
    body = chat(FakeTriton(call_reply()), functions=[FUNCTION]).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }


def test_a_streamed_functions_reply_names_its_call_function_call():
    from test_frontend_unit import events

    r = chat(FakeTriton(call_reply()), functions=[FUNCTION], stream=True)
    chunks = [c for c in events(r.text.replace("data: [DONE]\n\n", "")) if c["choices"]]
    calls = [c["choices"][0]["delta"].get("function_call") for c in chunks]
    calls = [c for c in calls if c]
    assert calls[0]["name"] == "get_weather"
    assert json.loads("".join(c["arguments"] for c in calls)) == {"city": "Paris"}
    assert not any("tool_calls" in c["choices"][0]["delta"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "function_call"


# ---------------------------------------------------------------------------------------------
# The render routes


class DecodingFake(FakeTriton):
    async def infer(self, model, inputs):
        if "token_ids" in inputs:
            self.calls.append((model, inputs))
            return {"decoded_text": np.array([b"<s>Hi"], dtype=object)}
        return await super().infer(model, inputs)


def test_render_gives_the_prompt_ids_generation_sees():
    fake = DecodingFake()
    c = client(fake)
    body = {"model": "m", "messages": MESSAGES, "functions": [FUNCTION], "reasoning_effort": "none"}
    rendered = c.post("/v1/chat/completions/render", json=body).json()
    assert rendered["token_ids"] == [1, 15043] and rendered["prompt"] == "<s>Hi"
    assert rendered["model"] == "m" and rendered["request_id"].startswith("chatcmpl-")
    assert rendered["features"] is None
    pre = fake.calls[0][1]  # preprocessing got what generation sends it: template kwargs and tools
    assert json.loads(pre["chat_template_kwargs"][0]) == {"enable_thinking": False}
    assert json.loads(pre["chat_tools"][0])[0]["function"]["name"] == "get_weather"
    assert [name for name, _ in fake.calls] == ["preprocessing", "preprocessing"]  # no generation
    completions = c.post("/v1/completions/render", json={"model": "m", "prompt": "Hi"}).json()
    assert [r["token_ids"] for r in completions] == [[1, 15043]]
    assert completions[0]["request_id"].startswith("cmpl-")


def test_render_refuses_what_generation_refuses():
    c = client(DecodingFake())
    for path, body in (
        ("/v1/chat/completions", {"messages": MESSAGES, "logit_bias": {"32000": 1}}),
        ("/v1/chat/completions", {"messages": MESSAGES, "verbosity": "high"}),
        ("/v1/completions", {"prompt": "Hi", "temperature": -1}),
    ):
        generated = c.post(path, json={"model": "m", **body})
        rendered = c.post(path + "/render", json={"model": "m", **body})
        assert rendered.status_code == generated.status_code == 400
        assert rendered.json() == generated.json()


def test_render_of_rows_past_the_vocabulary_has_no_text():
    class TableFake(DecodingFake):
        async def infer(self, model, inputs):
            return {"input_ids": np.array([[VOCAB, 3]], dtype=np.int32)}

    rendered = client(TableFake()).post("/v1/completions/render", json={"model": "m", "prompt": "x"}).json()
    assert rendered == [{**rendered[0], "token_ids": [VOCAB, 3], "prompt": None}]


def test_schemas_take_the_same_fields_on_both_apis():
    shared = {"logit_bias", *NO_EFFECT}
    assert shared <= set(ChatCompletionRequest.model_fields) & set(CompletionRequest.model_fields)


def test_deprecated_function_turns_render_as_tool_calls():
    call = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "21C"},
    ]
    assert job(messages=history, functions=[FUNCTION]).to_job().messages == [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "name": "get_weather", "content": "21C", "tool_call_id": "call_1"},
    ]
    for bad, param in (
        ({"role": "function", "content": "21C"}, "name"),
        ({"role": "user", "content": "x", "name": "f"}, "name"),
        ({"role": "user", "content": "x", "function_call": call}, "function_call"),
    ):
        assert error(chat(FakeTriton(), messages=[bad]))[1].startswith(f"messages[0]: {param}:")
