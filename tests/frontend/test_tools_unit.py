"""Tool calls and reasoning through the chat routes, against a fake Triton that "writes" recorded
replies in small chunks: what reaches preprocessing and the engine, the whole reply, and the stream's deltas
(OpenAI's shape; fragments that concatenate to the whole reply's arguments)."""

from __future__ import annotations

import json

import numpy as np
from test_frontend_unit import FakeTriton, request_inputs, response
from test_openai_unit import client, values

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
REPLY = (
    "<think>The user asks about Paris.</think>\n\nChecking.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def chunked(text: str, size: int = 3) -> list[dict[str, np.ndarray]]:
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    out = [response([(i, p, -0.5, False)]) for i, p in enumerate(pieces)]
    out.append(response([(2, "", -0.1, True)], finish="end_id"))
    return out


def post(fake: FakeTriton, **body):
    return client(fake).post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **body})


def stream_events(fake: FakeTriton, **body) -> list[dict]:
    r = post(fake, stream=True, **body)
    assert r.status_code == 200, r.text
    data = [c.removeprefix("data: ") for c in r.text.split("\n\n") if c]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_auto_tool_call_and_reasoning_whole_and_streamed():
    fake = FakeTriton(chunked(REPLY))
    body = post(fake, tools=[WEATHER]).json()
    sent = values(request_inputs(fake)[0])
    assert json.loads(sent["chat_tools"]) == [WEATHER]  # the template sees the tools
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["reasoning_content"] == "The user asks about Paris."
    assert message["content"] == "Checking."
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}

    chunks = stream_events(FakeTriton(chunked(REPLY, 2)), tools=[WEATHER])
    deltas = [c["choices"][0]["delta"] for c in chunks]
    text = "".join(d.get("content") or "" for d in deltas)
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert (thought, text) == ("The user asks about Paris.", "Checking.")  # no tag leaks out
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["index"] == 0 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"]["name"] == "get_weather"
    assert all("id" not in c and "name" not in c["function"] for c in calls[1:])
    assert "".join(c["function"]["arguments"] for c in calls) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_no_tools_no_thinking_leaves_the_text_alone():
    text = "a <think> b"
    body = post(FakeTriton(chunked(text)), chat_template_kwargs={"enable_thinking": False}).json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text, "tool_calls": []}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_none_hides_the_tools_and_reads_no_calls():
    fake = FakeTriton(chunked(REPLY))
    body = post(fake, tools=[WEATHER], tool_choice="none").json()
    assert "chat_tools" not in values(request_inputs(fake)[0])
    assert body["choices"][0]["message"]["tool_calls"] == []
    assert "<tool_call>" in body["choices"][0]["message"]["content"]


def test_named_and_required_choices_read_the_guided_json():
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = post(FakeTriton(chunked('{"city": "Paris"}')), tools=[WEATHER], tool_choice=named).json()
    call = body["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    reply = '[{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    chunks = stream_events(FakeTriton(chunked(reply)), tools=[WEATHER], tool_choice="required")
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Rome"}'


def test_databricks_chat_tool_calls():
    fake = FakeTriton(chunked(REPLY))
    r = client(fake).post(
        "/serving-endpoints/m/invocations", json={"messages": MESSAGES, "tools": [WEATHER], "max_tokens": 9}
    )
    message = r.json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"


def tools_in_prompt_guide(**body) -> dict[str, object]:
    """What reaches the ensemble from a server whose chat template knows no tools."""
    fake = FakeTriton(chunked(REPLY))
    assert (
        client(fake, tools_in_prompt=True)
        .post("/v1/chat/completions", json={"model": "m", "messages": MESSAGES, **body})
        .status_code
        == 200
    )
    return values(request_inputs(fake)[0])


def test_auto_with_tools_in_the_prompt_is_held_to_valid_call_blocks():
    sent = tools_in_prompt_guide(tools=[WEATHER])
    assert sent["guided_decoding_guide_type"] == "structural_tag"
    tag = json.loads(sent["guided_decoding_guide"])["format"]
    assert tag["triggers"] == ["<tool_call>"] and tag["stop_after_first"] is False
    (block,) = tag["tags"]
    assert (block["begin"], block["end"]) == ("<tool_call>\n", "\n</tool_call>")
    call = block["content"]["json_schema"]
    assert call["properties"] == {
        "name": {"const": "get_weather"},
        "arguments": WEATHER["function"]["parameters"],
    }
    one = tools_in_prompt_guide(tools=[WEATHER], parallel_tool_calls=False)
    assert json.loads(one["guided_decoding_guide"])["format"]["stop_after_first"] is True
    # No tools, tool_choice none, or an explicit response format: no call guide.
    assert "guided_decoding_guide" not in tools_in_prompt_guide()
    assert "guided_decoding_guide" not in tools_in_prompt_guide(tools=[WEATHER], tool_choice="none")
    fmt = tools_in_prompt_guide(tools=[WEATHER], response_format={"type": "json_object"})
    assert fmt["guided_decoding_guide_type"] == "json"
    # A template that renders the tools itself: auto stays unguided.
    fake = FakeTriton(chunked(REPLY))
    post(fake, tools=[WEATHER])
    assert "guided_decoding_guide" not in values(request_inputs(fake)[0])


def test_the_call_block_guide_accepts_valid_calls_only(model_dir):
    import xgrammar as xgr

    from tritonlm.structured_output.grammars import Grammars
    from tritonlm.text.tokenization import load_tokenizer

    other = {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
    }
    sent = tools_in_prompt_guide(tools=[WEATHER, other])
    tokenizer = load_tokenizer(model_dir)
    compiled = Grammars(tokenizer, len(tokenizer)).compile("structural_tag", sent["guided_decoding_guide"])

    def accepts(text: str) -> bool:
        return xgr.GrammarMatcher(compiled.result(timeout=60)).accept_string(text)

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert accepts(
        "Sure. "
        + call
        + " and "
        + call.replace('"get_weather", "arguments": {"city": "Paris"}', '"now", "arguments": {}')
    )
    assert accepts("No call at all.")
    assert not accepts('<tool_call>\n{"name": "get_time", "arguments": {}}')  # not a tool
    assert not accepts(
        '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}'
    )  # bad arguments
