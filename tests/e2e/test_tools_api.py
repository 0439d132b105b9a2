"""End to end on the real tritonserver + frontend with the tiny model: tools reach the chat
template, `tool_choice` none / auto / required / a named function, history with tool calls, the
reasoning split, streamed and not, with the `openai` SDK; and, when the real instruct model is
present, a weather call that names Paris."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from tritonlm import contract
from tritonlm.text.preprocess import Preprocessor
from tritonlm.text.tokenization import load_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HISTORY = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
]
GUIDED = any(t.name == "guided_decoding_guide" for t in contract.ENGINE_INPUTS)
needs_guide = pytest.mark.skipif(not GUIDED, reason="guided decoding (the engine's grammar) is not merged")


@pytest.fixture(scope="module")
def client(servers) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers.frontend_url + "/v1", api_key="x", max_retries=0)


def ask(client, servers, **kwargs):
    args = {"model": servers.model_name, "messages": ASK, "max_tokens": 24, "temperature": 0, **kwargs}
    return client.chat.completions.create(**args)


def streamed(client, servers, **kwargs) -> tuple[str, str, dict[int, dict], list[str]]:
    """(content, reasoning, calls by index, finish reasons) of a stream."""
    content, reasoning, calls, reasons = "", "", {}, []
    for chunk in ask(client, servers, stream=True, **kwargs):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for tc in delta.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.type == "function" and tc.function.name, tc
                    calls[tc.index] = {"name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and not tc.function.name
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return content, reasoning, calls, reasons


def whole_calls(message) -> dict[int, dict]:
    return {
        i: {"name": c.function.name, "arguments": c.function.arguments}
        for i, c in enumerate(message.tool_calls or [])
    }


def test_tools_reach_the_template_and_none_hides_them(client, servers):
    plain = ask(client, servers)
    with_tools = ask(client, servers, tools=[WEATHER, TIME])
    hidden = ask(client, servers, tools=[WEATHER, TIME], tool_choice="none")
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    assert hidden.usage.prompt_tokens == plain.usage.prompt_tokens
    assert hidden.choices[0].message.content == plain.choices[0].message.content
    assert hidden.choices[0].message.tool_calls == []


def test_auto_streamed_equals_whole(client, servers):
    whole = ask(client, servers, tools=[WEATHER, TIME])
    content, _, calls, reasons = streamed(client, servers, tools=[WEATHER, TIME])
    message = whole.choices[0].message
    assert (content, calls) == (message.content or "", whole_calls(message))
    assert reasons == [whole.choices[0].finish_reason]
    assert whole.choices[0].finish_reason == ("tool_calls" if calls else whole.choices[0].finish_reason)


def test_history_with_tool_calls_renders_through_the_template(client, servers, model_dir):
    reply = ask(client, servers, messages=HISTORY, tools=[WEATHER])
    assert reply.usage.prompt_tokens > ask(client, servers, tools=[WEATHER]).usage.prompt_tokens
    # What the template wrote: the call (arguments as an object, not a string) and its result.
    tokenizer = load_tokenizer(model_dir)
    out = Preprocessor(tokenizer, 2048).process(
        {"chat_messages": [json.dumps(HISTORY).encode()], "chat_tools": [json.dumps([WEATHER]).encode()]}
    )
    prompt = tokenizer.decode(out["input_ids"][0].tolist())
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    assert f"<tool_call>\n{call}\n</tool_call>" in prompt
    assert '<tool_response id="call_1">\n{"temperature": 21}\n</tool_response>' in prompt
    assert (
        '"name": "get_time"' not in prompt
        and '{"type": "function", "function": {"name": "get_weather"' in prompt
    )


def test_reasoning_split_streamed_and_not(client, servers):
    think = {"chat_template_kwargs": {"enable_thinking": True}}
    whole = ask(client, servers, extra_body=think)
    message = whole.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content") or ""
    assert reasoning  # the prompt opened the thought: the reply starts in it
    content, streamed_reasoning, _, _ = streamed(client, servers, extra_body=think)
    assert (streamed_reasoning, content) == (reasoning, message.content or "")
    off = ask(client, servers, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})


def test_reasoning_effort_switches_thinking(client, servers):
    thinking = ask(client, servers, reasoning_effort="high").choices[0].message
    assert (thinking.model_extra or {}).get("reasoning_content")  # the template opened the thought
    for effort in ("none", "minimal"):
        off = ask(client, servers, reasoning_effort=effort).choices[0].message
        assert "reasoning_content" not in (off.model_extra or {})


@needs_guide
@pytest.mark.parametrize("stream", [False, True])
def test_deprecated_functions_make_a_function_call(client, servers, stream):
    functions = [WEATHER["function"], TIME["function"]]
    kwargs = {"functions": functions, "function_call": {"name": "get_weather"}, "max_tokens": 200}
    if stream:
        call, reasons = {"name": "", "arguments": ""}, []
        for chunk in ask(client, servers, stream=True, **kwargs):
            for choice in chunk.choices:
                assert not choice.delta.tool_calls
                if choice.delta.function_call:
                    call["name"] += choice.delta.function_call.name or ""
                    call["arguments"] += choice.delta.function_call.arguments or ""
                reasons += [choice.finish_reason] if choice.finish_reason else []
        assert reasons == ["function_call"]
    else:
        reply = ask(client, servers, **kwargs).choices[0]
        assert reply.finish_reason == "function_call" and not reply.message.tool_calls
        call = {"name": reply.message.function_call.name, "arguments": reply.message.function_call.arguments}
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])


def test_deprecated_function_turns_render_as_tool_calls(servers):
    legacy = [
        *ASK,
        {"role": "assistant", "content": None, "function_call": HISTORY[1]["tool_calls"][0]["function"]},
        {"role": "function", "name": "get_weather", "content": HISTORY[2]["content"]},
    ]

    def rendered(**body) -> list[int]:
        body = {"model": servers.model_name, **body}
        r = httpx.post(servers.frontend_url + "/v1/chat/completions/render", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["token_ids"]

    assert rendered(messages=legacy, functions=[WEATHER["function"]]) == rendered(
        messages=HISTORY, tools=[WEATHER]
    )


@needs_guide
@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_calls_validate(client, servers, stream):
    tools = {WEATHER["function"]["name"]: WEATHER, TIME["function"]["name"]: TIME}
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        for parallel in (True, False):
            kwargs = {"tools": [WEATHER, TIME], "tool_choice": choice, "parallel_tool_calls": parallel}
            kwargs["max_tokens"] = 200
            if stream:
                _, _, calls, reasons = streamed(client, servers, **kwargs)
                whole = ask(client, servers, **kwargs)
                assert calls == whole_calls(whole.choices[0].message)  # fragments == whole arguments
                assert reasons == ["tool_calls"]
            else:
                reply = ask(client, servers, **kwargs)
                assert reply.choices[0].finish_reason == "tool_calls"
                calls = whole_calls(reply.choices[0].message)
            assert calls
            if not parallel or choice != "required":
                assert len(calls) == 1
            for call in calls.values():
                if choice != "required":
                    assert call["name"] == "get_time"
                schema = tools[call["name"]]["function"]["parameters"]
                jsonschema.validate(json.loads(call["arguments"]), schema)


@needs_guide
def test_required_with_n_and_sampling(client, servers):
    reply = ask(
        client, servers, tools=[WEATHER], tool_choice="required", n=2, temperature=1.0, seed=3, max_tokens=200
    )
    for choice in reply.choices:
        (call,) = whole_calls(choice.message).values()
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])


FORECAST = {  # no free strings: a call block is short, and ends within a few tokens
    "type": "function",
    "function": {
        "name": "forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["unit", "days"],
            "additionalProperties": False,
        },
    },
}
CALL_TOKEN = "<tool_call>"


def template_without_tools(model_dir: Path, into: Path) -> Path:
    """A copy of the model whose chat template knows no tools (plain ChatML), and whose lm_head
    favours `<tool_call>` (its row scaled up), so that the random model opens call blocks often."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, into)
    config_path = into / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config_path.write_text(json.dumps(config))
    (token,) = load_tokenizer(into).encode(CALL_TOKEN, add_special_tokens=False)
    weights = load_file(into / "model.safetensors")
    weights["lm_head.weight"][token] *= 30
    save_file(
        {k: v.contiguous() for k, v in weights.items()}, into / "model.safetensors", metadata={"format": "pt"}
    )
    return into


@needs_guide
def test_auto_on_a_template_without_tools_writes_only_valid_calls(model_dir, tmp_path):
    from conftest import running_servers

    schema = FORECAST["function"]["parameters"]
    with running_servers(template_without_tools(model_dir, tmp_path / "model"), {}) as plain:
        client = openai.OpenAI(base_url=plain.frontend_url + "/v1", api_key="x", max_retries=0)
        calls = 0
        for seed in range(4):
            for parallel in (True, False):
                reply = client.chat.completions.create(
                    model=plain.model_name,
                    messages=[{"role": "user", "content": "Forecast?"}],
                    tools=[FORECAST],
                    parallel_tool_calls=parallel,
                    temperature=1,
                    seed=seed,
                    max_tokens=80,
                )
                message = reply.choices[0].message
                cut = reply.usage.completion_tokens == 80  # (finish_reason says tool_calls then)
                done = (message.tool_calls or [])[: -1 if cut else None]  # max_tokens may cut the last
                for call in done:
                    assert call.function.name == "forecast"
                    jsonschema.validate(json.loads(call.function.arguments), schema)
                calls += len(done)
                if not parallel:  # the grammar ends after the first block
                    assert len(message.tool_calls or []) <= 1
                # Only a block that max_tokens cut may be left as text.
                text = message.content or ""
                assert text.count(CALL_TOKEN) <= (1 if cut else 0)
    assert calls >= 4
