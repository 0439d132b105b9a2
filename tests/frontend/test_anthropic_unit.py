"""Anthropic's Messages API, pure parts: a request's blocks as chat messages and a Job
(frontend.anthropic.convert), replies as content blocks and stream events (frontend.anthropic.format),
and errors in Anthropic's shape with dotted field paths (frontend.errors)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from frontend.anthropic.convert import create_job, prompt_job
from frontend.anthropic.format import Blocks, MessageFormat, MessageStream, signature, stop_reason
from frontend.anthropic.schema import CountTokensRequest, MessagesRequest
from frontend.app import create_app
from frontend.chat_tools.reply import reply_reader
from frontend.config import FrontendConfig
from frontend.engine_client.request import Job
from frontend.engine_client.steps import Generation, Step
from frontend.errors import APIError, anthropic_body, anthropic_status

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def request(**fields) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return MessagesRequest.model_validate(body)


def test_blocks_become_chat_messages_with_tool_rounds():
    req = request(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "x"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C"},
                    {"type": "text", "text": "And Rome?"},
                ],
            },
        ],
    )
    job, refs = create_job(req)
    assert refs == []
    assert job.messages == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },  # fmt: skip
        {"role": "tool", "tool_call_id": "toolu_1", "content": "21C"},
        {"role": "user", "content": [{"type": "text", "text": "And Rome?"}]},
    ]
    assert job.tools is not None and job.tools.choice == "auto" and job.guide is None
    assert job.chat_template_kwargs == {"enable_thinking": False}
    assert (job.max_tokens, job.sampling("temperature"), job.prompt_param) == (16, 1.0, "messages")


PNG = {"type": "base64", "media_type": "image/png", "data": "AAA="}
ANSWERED = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
USER_CALL = [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]


def test_error_results_images_and_sampling():
    req = request(
        temperature=0,
        top_k=5,
        stop_sequences=["END"],
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "is_error": True,
                        "content": [{"type": "text", "text": "boom"}],
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAA="},
                    },
                ],
            },  # fmt: skip
        ],
    )
    job, refs = create_job(req)
    assert job.messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert job.messages[2] == {"role": "tool", "tool_call_id": "t", "content": "Error: boom"}
    assert job.messages[3] == {"role": "user", "content": [{"type": "image", "image": "<image>"}]}
    assert [(r.kind, r.source, r.part) for r in refs] == [
        ("image", "data:image/png;base64,AAA=", "messages.2.content.1")
    ]
    assert (job.temperature, job.top_k, job.stop) == (0, 5, ["END"])
    assert "temperature" in job.values() and "runtime_top_k" not in job.values()  # greedy


@pytest.mark.parametrize(
    "choice, expected",
    [
        ({"type": "auto"}, ("auto", None, True)),
        ({"type": "any", "disable_parallel_tool_use": True}, ("required", None, False)),
        ({"type": "tool", "name": "get_weather"}, ("function", "get_weather", True)),
    ],
)
def test_tool_choice_maps_onto_the_chat_paths_tool_spec(choice, expected):
    job, _ = create_job(request(tools=[WEATHER], tool_choice=choice))
    assert job.tools is not None
    assert (job.tools.choice, job.tools.name, job.tools.parallel) == expected
    assert (job.guide is not None) == (expected[0] != "auto")


def test_tool_choice_none_and_thinking():
    job, _ = create_job(request(tools=[WEATHER], tool_choice={"type": "none"}))
    assert job.tools is None
    job, _ = create_job(request(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024}))
    assert job.chat_template_kwargs == {"enable_thinking": True}
    count = CountTokensRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    job, _ = prompt_job(count)
    assert job.max_tokens is None and not job.stream


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "messages.1",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}]},
            "messages.0.content.0.tool_use_id",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}
                ]
            },
            "messages.0.content.0",
        ),  # a user message holds no tool_use
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ],
)
def test_rules_between_fields_name_the_field(fields, param):
    with pytest.raises(APIError) as error:
        create_job(request(**fields))
    assert error.value.status == 400 and error.value.param == param


def hermes_reply() -> tuple[MessageFormat, Job]:
    job, _ = create_job(request(tools=[WEATHER]))
    job.chat_template_kwargs = None  # the template decides: a reply may open <think>
    return MessageFormat("m", "hermes", "think"), job


REPLY = (
    '<think>\nweather</think>\n\nSure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
    "\n</tool_call>\n"
)


def test_a_whole_reply_is_thinking_text_and_tool_use_blocks():
    fmt, job = hermes_reply()
    gen = Generation(text=REPLY, finish_reason="end_id", prompt_tokens=9, cached_tokens=4)
    message = fmt.message(gen, job)
    thinking, text, call = message["content"]
    assert thinking == {"type": "thinking", "thinking": "\nweather", "signature": signature("\nweather")}
    assert text == {"type": "text", "text": "Sure."}
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_")
    assert (call["name"], call["input"]) == ("get_weather", {"city": "Paris"})
    assert message["id"].startswith("msg_") and message["stop_reason"] == "tool_use"
    assert message["usage"] == {
        "input_tokens": 5,
        "output_tokens": 0,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }


def without_ids(blocks: list[dict]) -> list[dict]:
    return [{k: v for k, v in block.items() if k != "id"} for block in blocks]


def test_a_stream_char_by_char_builds_the_same_blocks_in_event_order():
    fmt, job = hermes_reply()
    stream = MessageStream(fmt, job)
    events = []
    for i, char in enumerate(REPLY):
        last = i == len(REPLY) - 1
        events += stream.push(Step(char, [], "end_id" if last else "", prompt_tokens=9 if i == 0 else None))
    kinds = [kind for kind, _ in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    whole = fmt.message(Generation(text=REPLY, finish_reason="end_id"), job)["content"]
    assert stream.done and without_ids(stream.blocks.content) == without_ids(whole)
    starts = [data["content_block"]["type"] for kind, data in events if kind == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    assert kinds.count("content_block_stop") == 3
    deltas = [data["delta"] for kind, data in events if kind == "content_block_delta"]
    args = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert json.loads(args) == {"city": "Paris"}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_stop_reasons():
    job = Job(stop=["END"])
    reader = reply_reader(None, None, "hermes", "none")
    assert stop_reason(Generation(finish_reason="length"), reader, job) == ("max_tokens", None)
    assert stop_reason(Generation(finish_reason="end_id"), reader, job) == ("end_turn", None)
    hit = Generation(finish_reason="stop_words", stop_reason="END")
    assert stop_reason(hit, reader, job) == ("stop_sequence", "END")
    assert stop_reason(Generation(finish_reason="stop_words"), reader, job) == ("end_turn", None)
    assert stop_reason(Generation(), reader, job) == (None, None)


def test_whitespace_between_calls_opens_no_text_block():
    blocks = Blocks()
    fmt, job = hermes_reply()
    reader = fmt.reader(job)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n</tool_call>'
    for piece in [call, "\n", call]:
        blocks.push(reader.feed(piece))
    blocks.push(reader.finish())
    blocks.finish()
    assert [b["type"] for b in blocks.content] == ["tool_use", "tool_use"]


def test_error_shape_and_statuses():
    assert anthropic_body(APIError(422, "bad")) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert [anthropic_status(s) for s in (400, 401, 404, 413, 422, 429, 500, 503)] == [
        400, 401, 404, 413, 400, 429, 500, 529,
    ]  # fmt: skip
    assert anthropic_body(APIError(503, "down"))["error"]["type"] == "overloaded_error"
    assert anthropic_body(APIError(404, "no", "invalid_request_error"))["error"]["type"] == "not_found_error"


def test_validation_errors_name_the_block_by_its_dotted_path():
    with pytest.raises(ValidationError):
        request(messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}])
    client = TestClient(create_app(FrontendConfig(triton_urls="unused:8001", served_model_name="m")))
    bad_source = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "x"}}
    content = [{"type": "text", "text": "a"}, bad_source]
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("messages.0.content.1.source.base64.media_type:")
    r = client.post("/v1/messages", json={**body, "container": "x"})
    assert r.status_code == 400 and "container: unknown field" in r.json()["error"]["message"]
    r = client.post("/v1/messages", json={k: v for k, v in body.items() if k != "max_tokens"})
    assert r.json()["error"]["message"].endswith("; max_tokens: required field is missing")
    r = client.post("/v1/messages/count_tokens", json={"model": "nope", "messages": body["messages"][:0]})
    assert r.status_code in (400, 404) and r.json()["type"] == "error"


def test_a_failure_mid_stream_is_an_error_event():
    """Triton fails after the first token: the stream, whose headers are sent, ends with Anthropic's
    `error` event (a fake Triton: the engine cannot be made to fail on cue)."""
    from test_frontend_unit import FakeTriton, client_for, response

    fake = FakeTriton(
        [response([(10, "Hello", -0.5, False)])], error=APIError(500, "engine died"), error_after=1
    )
    body = {
        "model": "test-model",
        "max_tokens": 4,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    r = client_for(fake).post("/v1/messages", json=body)
    assert r.status_code == 200
    events = [block.split("\n") for block in r.text.strip().split("\n\n")]
    kinds = [lines[0].removeprefix("event: ") for lines in events]
    assert kinds == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert json.loads(events[-1][1].removeprefix("data: ")) == {
        "type": "error",
        "error": {"type": "api_error", "message": "engine died"},
    }
