"""Anthropic's Messages API end to end, through the `anthropic` SDK, on the real tritonserver +
frontend with the tiny model: text, multi-turn, streams (events in order, deltas equal to the final
message, which equals the non-streamed one), tool use with a round trip of its result, a forced tool
whose input matches its schema, token counting, thinking, errors in Anthropic's shape, API keys."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import pytest
from conftest import Servers, frontend_beside

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
KEY = "sk-ant-test-0123456789"


@pytest.fixture(scope="module")
def client(servers: Servers) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=servers.frontend_url, api_key="unused", max_retries=0)


def arguments(servers, kwargs) -> dict:
    """Greedy: this SDK no longer sends `temperature` itself (Anthropic's API still takes it)."""
    extra = {"temperature": 0, **kwargs.pop("extra_body", {})}
    return {"model": servers.model_name, "max_tokens": 12, "messages": ASK, "extra_body": extra, **kwargs}


def create(client, servers, **kwargs):
    return client.messages.create(**arguments(servers, kwargs))


def streamed(client, servers, **kwargs) -> tuple[list, anthropic.types.Message]:
    """The raw events of a stream and its final message."""
    with client.messages.stream(**arguments(servers, kwargs)) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def without_ids(message: anthropic.types.Message) -> dict:
    """The message but its ids, with the prompt's tokens counted whole (which of them the prefix
    cache held depends on the requests before)."""
    body = message.model_dump()
    body.pop("id")
    for block in body["content"]:
        block.pop("id", None)
    usage = body.pop("usage")
    body["tokens"] = (usage["input_tokens"] + usage["cache_read_input_tokens"], usage["output_tokens"])
    return body


def raw_events(servers, **body) -> list[tuple[str, dict]]:
    """A stream's events as sent: (event, data) pairs."""
    body = {"model": servers.model_name, "max_tokens": 12, "temperature": 0, "messages": ASK, **body}
    events = []
    with httpx.stream("POST", servers.frontend_url + "/v1/messages", json={**body, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for block in r.read().decode().split("\n\n"):
            if block:
                kind, data = block.split("\n")
                events.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_create_answers_a_message(client, servers):
    message = create(client, servers, system="You are terse.")
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == servers.model_name
    assert [block.type for block in message.content] == ["text"] and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    usage = message.usage
    assert usage.output_tokens == 12 if message.stop_reason == "max_tokens" else usage.output_tokens <= 12
    assert usage.input_tokens + usage.cache_read_input_tokens > 0 and usage.cache_creation_input_tokens == 0


def test_multi_turn_and_the_prefix_cache(client, servers):
    first = create(client, servers)
    turns = [*ASK, {"role": "assistant", "content": first.content}, {"role": "user", "content": "And Rome?"}]
    again = create(client, servers, messages=turns)
    assert again.content and again.content[0].type == "text"
    repeat = create(client, servers, messages=turns)
    assert repeat.usage.cache_read_input_tokens > 0  # the same prompt's KV blocks are reused
    assert (
        repeat.usage.input_tokens + repeat.usage.cache_read_input_tokens
        == again.usage.input_tokens + again.usage.cache_read_input_tokens
    )


def test_a_stream_has_anthropics_events_in_order_and_equals_create(client, servers):
    events = raw_events(servers, stop_sequences=["\n\n"])
    kinds = [kind for kind, _ in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"} and all(kind == data["type"] for kind, data in events)
    deltas = "".join(data["delta"]["text"] for kind, data in events if kind == "content_block_delta")
    _, final = streamed(client, servers, stop_sequences=["\n\n"])
    assert deltas == final.content[0].text
    assert without_ids(final) == without_ids(create(client, servers, stop_sequences=["\n\n"]))


def test_a_stop_sequence_is_reported(client, servers):
    probe = create(client, servers, max_tokens=8)
    text = probe.content[0].text
    word = text.strip().split()[1] if len(text.strip().split()) > 1 else text.strip()[-1]
    message = create(client, servers, max_tokens=8, stop_sequences=[word])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == word
    assert word not in message.content[0].text if message.content else True


def test_a_forced_tool_gives_input_that_matches_its_schema_and_its_result_goes_back(client, servers):
    forced = {"type": "tool", "name": "get_weather"}
    message = create(client, servers, max_tokens=60, tools=[WEATHER], tool_choice=forced)
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    assert message.stop_reason == "tool_use"
    _, final = streamed(client, servers, max_tokens=60, tools=[WEATHER], tool_choice=forced)
    assert without_ids(final) == without_ids(message)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "21 C"}]}
    history = [*ASK, {"role": "assistant", "content": message.content}, {"role": "user", "content": [result]}]
    for choice in ({"type": "auto"}, {"type": "none"}):
        answer = create(client, servers, tools=[WEATHER], tool_choice=choice, messages=history)
        assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    error_result = {**result, "is_error": True}
    history[-1] = {"role": "user", "content": [error_result]}
    assert create(client, servers, tools=[WEATHER], messages=history).content is not None


def test_any_tool_with_one_call_streams_its_input_as_json_deltas(client, servers):
    choice = {"type": "any", "disable_parallel_tool_use": True}
    events, final = streamed(client, servers, max_tokens=60, tools=[WEATHER], tool_choice=choice)
    (call,) = final.content
    assert call.type == "tool_use" and final.stop_reason == "tool_use"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)


def test_count_tokens_equals_the_prompt_a_create_reports(client, servers):
    request = {"system": "Be brief.", "tools": [WEATHER], "messages": ASK}
    count = client.messages.count_tokens(model=servers.model_name, **request)
    message = create(client, servers, max_tokens=2, **request)
    assert count.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert (
        count.input_tokens > client.messages.count_tokens(model=servers.model_name, messages=ASK).input_tokens
    )


def test_thinking_on_the_tiny_models_think_template(client, servers):
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = create(client, servers, max_tokens=1030, thinking=thinking, stop_sequences=["."])
    assert message.content[0].type == "thinking"  # the prompt opened the thought
    assert message.content[0].thinking and message.content[0].signature
    events, final = streamed(client, servers, max_tokens=1030, thinking=thinking, stop_sequences=["."])
    assert without_ids(final) == without_ids(message)
    assert any(e.type == "content_block_delta" and e.delta.type == "thinking_delta" for e in events)
    off = create(client, servers, thinking={"type": "disabled"})
    assert all(block.type != "thinking" for block in off.content)


def test_errors_are_anthropics(client, servers):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    content = [{"type": "text", "text": "What is this?"}, image]
    with pytest.raises(anthropic.BadRequestError) as error:
        create(client, servers, messages=[{"role": "user", "content": content}])
    assert error.value.status_code == 400
    body = error.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert (
        body["error"]["message"].startswith("messages.0.content.1")
        and "text-only" in body["error"]["message"]
    )
    with pytest.raises(anthropic.BadRequestError) as error:
        create(client, servers, max_tokens=0)
    assert error.value.body["error"]["message"].startswith("max_tokens:")
    with pytest.raises(anthropic.BadRequestError) as error:
        create(client, servers, extra_body={"service_tier": "auto"})
    assert "service_tier: unknown field" in error.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as missing:
        create(client, servers, model="no-such-model")
    assert missing.value.body["error"]["type"] == "not_found_error"
    r = httpx.post(
        servers.frontend_url + "/v1/messages", content=b"{", headers={"anthropic-version": "2023-06-01"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def keyed_frontend(servers: Servers, tmp_path_factory) -> Iterator[str]:
    """A second frontend on the session's tritonserver, with an API key."""
    with frontend_beside(servers, {"API_KEY": KEY}, tmp_path_factory.mktemp("keyed")) as url:
        yield url


def test_api_keys_by_x_api_key_and_bearer(keyed_frontend, servers):
    args = {"model": servers.model_name, "max_tokens": 2, "messages": ASK}
    by_header = anthropic.Anthropic(base_url=keyed_frontend, api_key=KEY, max_retries=0)
    assert by_header.messages.create(**args).content
    by_bearer = anthropic.Anthropic(base_url=keyed_frontend, auth_token=KEY, max_retries=0)
    assert by_bearer.messages.count_tokens(model=servers.model_name, messages=ASK).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as error:
        anthropic.Anthropic(base_url=keyed_frontend, api_key="wrong", max_retries=0).messages.create(**args)
    assert error.value.body["error"]["type"] == "authentication_error"
    # The OpenAI routes take x-api-key too, and keep their own error shape.
    chat = {"model": servers.model_name, "max_tokens": 2, "messages": ASK}
    r = httpx.post(keyed_frontend + "/v1/chat/completions", json=chat, headers={"x-api-key": KEY})
    assert r.status_code == 200
    r = httpx.post(keyed_frontend + "/v1/chat/completions", json=chat)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
