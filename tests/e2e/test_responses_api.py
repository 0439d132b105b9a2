"""OpenAI's Responses API end to end, through the `openai` SDK, on the real tritonserver + frontend
with the tiny model: text (the same reply as chat completions), multi-turn with
`previous_response_id` (prefix-cache hits), streamed events, function calling with a round trip of
the tool's result, structured output, stored responses (GET, DELETE, eviction), errors naming the
parameter, API keys."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from conftest import Servers, frontend_beside

KEY = "sk-responses-test"
WEATHER = {
    "type": "function",
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
    "strict": True,
}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
TEXT = {"type": "input_text", "text": "Hi"}
FILE = {"type": "input_file", "file_id": "file-1"}
IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
CITY_FORMAT = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}


@pytest.fixture(scope="module")
def client(servers: Servers) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers.frontend_url + "/v1", api_key="x", max_retries=0)


def create(client: openai.OpenAI, servers: Servers, **kwargs):
    args = {"model": servers.model_name, "max_output_tokens": 12, "temperature": 0, **kwargs}
    return client.responses.create(**args)


def chat(client: openai.OpenAI, servers: Servers, messages: list, **kwargs):
    args = {"model": servers.model_name, "max_tokens": 12, "temperature": 0, **kwargs}
    return client.chat.completions.create(messages=messages, **args)


def comparable(resp) -> dict:
    """A response without what differs between two runs (ids, call ids, times, prefix-cache hits) and what
    the SDK's stream helper adds (what it parsed)."""
    body = resp.model_dump(exclude={"id", "created_at", "completed_at"})
    body["output"] = [
        {k: v for k, v in item.items() if k not in ("id", "call_id", "parsed_arguments")}
        for item in body["output"]
    ]
    for item in body["output"]:
        item["content"] = [{k: v for k, v in c.items() if k != "parsed"} for c in item.get("content") or []]
    body["usage"]["input_tokens_details"]["cached_tokens"] = None
    return body


def test_text_is_the_chat_reply(client, servers):
    resp = create(client, servers, input="Hello, who are you?", instructions="Be brief.")
    same = chat(
        client,
        servers,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, who are you?"}],
    )
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.model == servers.model_name
    message = same.choices[0].message
    assert resp.output_text == (message.content or "")
    reasoning = [i for i in resp.output if i.type == "reasoning"]
    thought = (message.model_extra or {}).get("reasoning_content") or ""
    assert "".join(c.text for i in reasoning for c in i.content or []) == thought
    assert resp.usage.input_tokens == same.usage.prompt_tokens
    assert resp.usage.output_tokens == same.usage.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.usage.output_tokens_details.reasoning_tokens <= resp.usage.output_tokens
    assert (resp.status == "incomplete") == (same.choices[0].finish_reason == "length")
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.instructions == "Be brief." and resp.temperature == 0 and resp.store is True


def test_previous_response_id_continues_and_reuses_the_cache(client, servers):
    first = create(client, servers, input="My name is Ann. Remember it.", reasoning={"effort": "none"})
    second = create(
        client, servers, input="What is my name?", previous_response_id=first.id, reasoning={"effort": "none"}
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens > 0
    history = [
        {"role": "user", "content": "My name is Ann. Remember it."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    same = chat(client, servers, history, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert second.usage.input_tokens == same.usage.prompt_tokens
    assert second.output_text == (same.choices[0].message.content or "")


def test_stream_events_in_order_and_final_equals_whole(client, servers):
    args = {"model": servers.model_name, "input": "Name a city.", "max_output_tokens": 60, "temperature": 0}
    whole = client.responses.create(**args, text=CITY_FORMAT)
    with client.responses.stream(**args, text=CITY_FORMAT) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for kind in ("output_item.added", "content_part.added", "output_text.done", "content_part.done"):
        assert f"response.{kind}" in kinds
    assert kinds.index("response.output_text.done") < kinds.index("response.output_item.done")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text
    jsonschema.validate(json.loads(final.output_text), CITY)
    assert comparable(final) == comparable(whole) and final.status == "completed"
    assert client.responses.retrieve(final.id).output_text == final.output_text  # stored at the end


def test_max_output_tokens_makes_the_stream_incomplete(servers):
    body = {
        "model": servers.model_name,
        "input": "Hi",
        "max_output_tokens": 2,
        "stream": True,
        "reasoning": {"effort": "none"},
    }
    events = []
    with httpx.stream("POST", servers.frontend_url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    for name, data in zip(lines[::2], lines[1::2], strict=True):
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    last = events[-1]
    assert last["type"] == "response.incomplete" and last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["usage"]["output_tokens"] == 2


def test_function_call_and_the_tools_result(client, servers):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = create(client, servers, input=ask, tools=[WEATHER], tool_choice="required", max_output_tokens=60)
    calls = [i for i in called.output if i.type == "function_call"]
    assert len(calls) >= 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 21}'}
    # The result after the stored turn, and the same conversation sent whole: one prompt.
    answer = create(
        client, servers, input=[result], previous_response_id=called.id, tools=[WEATHER], tool_choice="none"
    )
    resent = create(
        client, servers, input=[*ask, *called.output, result], tools=[WEATHER], tool_choice="none"
    )
    assert answer.usage.input_tokens == resent.usage.input_tokens
    assert answer.output_text == resent.output_text
    # tool_choice none hides the tools, so the answer's prompt differs from the call's; sent again,
    # the prompt is the answer's, whose KV the prefix cache holds.
    assert resent.usage.input_tokens_details.cached_tokens > 0
    # What chat completions answers to the same history.
    tool_calls = [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]
    history = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": tool_calls},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": '{"temperature": 21}'},
    ]
    if len(calls) == 1:
        chat_tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
        same = chat(client, servers, history, tools=chat_tools, tool_choice="none")
        assert same.usage.prompt_tokens == answer.usage.input_tokens
        assert (same.choices[0].message.content or "") == answer.output_text


def test_named_function_streams_its_arguments(client, servers):
    args = {
        "model": servers.model_name,
        "input": "Weather in Rome?",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 60,
        "temperature": 0,
    }
    whole = client.responses.create(**args)
    with client.responses.stream(**args) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    call = next(i for i in final.output if i.type == "function_call")
    assert (
        deltas
        == done[0].arguments
        == call.arguments
        == next(i for i in whole.output if i.type == "function_call").arguments
    )
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert comparable(final) == comparable(whole)


def test_json_object_and_logprobs(client, servers):
    resp = create(client, servers, input="A JSON object please.", text={"format": {"type": "json_object"}},
                  max_output_tokens=40, top_logprobs=2, reasoning={"effort": "none"})  # fmt: skip
    part = next(i for i in resp.output if i.type == "message").content[0]
    assert resp.top_logprobs == 2 and len(part.logprobs) == resp.usage.output_tokens
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    if resp.status == "completed":
        assert isinstance(json.loads(resp.output_text), dict)


def test_stored_responses_get_and_delete(client, servers):
    resp = create(client, servers, input="Hi", metadata={"topic": "greeting"})
    got = client.responses.retrieve(resp.id)
    assert got.model_dump() == resp.model_dump() and got.metadata == {"topic": "greeting"}
    deleted = httpx.delete(f"{servers.frontend_url}/v1/responses/{resp.id}", timeout=10)
    assert deleted.json() == {"id": resp.id, "object": "response", "deleted": True}
    for call in (lambda: client.responses.retrieve(resp.id), lambda: client.responses.delete(resp.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.body["message"].startswith(f"Response with id '{resp.id}' not found")
    unstored = create(client, servers, input="Hi", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as caught:
        create(client, servers, input="Hi", previous_response_id=unstored.id)
    assert caught.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize(
    "args, param",
    [
        ({"temperature": 3}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"truncation": "sometimes"}, "truncation"),
        ({"extra_body": {"prompt_cache_retention": "24h"}}, "prompt_cache_retention"),
        ({"extra_body": {"bogus": 1}}, "bogus"),
        ({"include": ["reasoning.encrypted_content"]}, "include[0]"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"input": [{"role": "user", "content": [FILE]}]}, "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [TEXT, IMAGE]}]}, "input[0].content[1]"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"input": "Hi " * 100_000}, "input"),
    ],
)  # fmt: skip
def test_bad_parameters_are_400_naming_them(client, servers, args, param):
    kwargs = {"input": "Hi", **args}
    with pytest.raises(openai.BadRequestError) as caught:
        create(client, servers, **kwargs)
    error = caught.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert param.split("[")[0] in error["message"]


# ---------------------------------------------------------------------------------------------
# A second frontend on the session's tritonserver: API keys and a store of two responses.


@pytest.fixture(scope="module")
def keyed(servers: Servers, tmp_path_factory) -> Iterator[str]:
    env = {"API_KEY": KEY, "RESPONSES_STORE_SIZE": "2"}
    with frontend_beside(servers, env, tmp_path_factory.mktemp("responses")) as url:
        yield url


def test_api_keys_and_store_eviction(keyed, servers):
    for key in (None, "sk-wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(
            keyed + "/v1/responses", json={"model": servers.model_name, "input": "Hi"}, headers=headers
        )
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    client = openai.OpenAI(base_url=keyed + "/v1", api_key=KEY, max_retries=0)
    made = [create(client, servers, input=f"Count {i}", max_output_tokens=2) for i in range(3)]
    with pytest.raises(openai.NotFoundError):  # the least recently created, evicted
        client.responses.retrieve(made[0].id)
    client.responses.retrieve(made[1].id)  # reading does not make it recent
    assert [client.responses.retrieve(m.id).id for m in made[1:]] == [m.id for m in made[1:]]
    newest = create(client, servers, input="Again", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made[1].id)
    assert client.responses.retrieve(newest.id).id == newest.id


def test_an_image_goes_the_chat_way_on_a_multimodal_model(multimodal_servers):
    """input_image through the multimodal path: the same prompt and reply as chat's image_url part."""
    from tests.multimodal_helpers import data_url, png

    servers = multimodal_servers("llava")
    client = openai.OpenAI(base_url=servers.frontend_url + "/v1", api_key="x", max_retries=0)
    image = data_url(png(11), "image/png")
    parts = [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": image}]
    resp = create(client, servers, input=[{"role": "user", "content": parts}], max_output_tokens=6)
    chat_parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": image}]
    same = chat(client, servers, [{"role": "user", "content": chat_parts}], max_tokens=6)
    assert resp.usage.input_tokens == same.usage.prompt_tokens > 20
    assert resp.output_text == (same.choices[0].message.content or "")
