"""The Responses API's pure parts: request validation, items → chat messages and Job, the output
items and their stream events, the bounded store."""

from __future__ import annotations

import pytest
from openai.types.responses import Response
from pydantic import ValidationError

from frontend.chat_tools.reply import reply_reader
from frontend.chat_tools.tools import ToolSpec
from frontend.engine_client.steps import Generation, Token
from frontend.errors import APIError
from frontend.responses.convert import to_turn
from frontend.responses.format import Envelope, Output, reasoning_tokens, whole
from frontend.responses.schema import ResponsesRequest
from frontend.responses.store import ResponseStore, Stored

TOOL = {
    "type": "function",
    "name": "f",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
}


HIGH_DETAIL = {"type": "input_image", "image_url": "x", "detail": "high"}


def request(**body) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "Hi", **body})


def test_items_become_chat_messages():
    req = request(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "image_url": "a.png"},
                ],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Calling.", "annotations": []}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"x": 2}'},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
        ],
    )
    turn = to_turn(req, [], "think")
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": '{"x": 2}'}},
    ]
    assert turn.job.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Look:"}, {"type": "image", "image": "<image>"}],
        },
        {"role": "assistant", "content": "Calling.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    assert [(r.kind, r.source, r.part) for r in turn.refs] == [("image", "a.png", "input[1].content[1]")]
    assert turn.job.prompt_param == "input" and turn.job.max_tokens_param == "max_output_tokens"


def test_a_continued_turn_follows_its_history_and_a_call_alone_is_an_assistant_message():
    history = [
        {"type": "message", "role": "user", "content": "Hi"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "f",
            "arguments": "{}",
            "id": "fc_1",
            "status": "completed",
        },
    ]
    turn = to_turn(
        request(input=[{"type": "function_call_output", "call_id": "c1", "output": "ok"}]), history, "none"
    )
    assert turn.job.messages == [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    assert turn.items == [{"type": "function_call_output", "call_id": "c1", "output": "ok"}]


def test_tools_choice_format_sampling_and_logprobs_reach_the_job():
    job = to_turn(
        request(tools=[TOOL], tool_choice="required", temperature=0, top_logprobs=3), [], "think"
    ).job
    assert (
        isinstance(job.tools, ToolSpec) and job.tools.choice == "required" and job.guide.type == "json_schema"
    )
    assert job.guide_param == "tools" and job.temperature == 0 and job.logprobs == 3
    named = request(tools=[TOOL], tool_choice={"type": "function", "name": "f"})
    assert to_turn(named, [], "think").job.tools.name == "f"
    schema = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    job = to_turn(request(text={"format": schema}, truncation="auto"), [], "think").job
    assert job.guide.text == '{"type": "object"}' and job.truncate_to_fit
    assert to_turn(request(include=["message.output_text.logprobs"]), [], "think").job.logprobs == 0


def test_reasoning_effort():
    assert to_turn(request(reasoning={"effort": "none"}), [], "think").job.chat_template_kwargs == {
        "enable_thinking": False
    }
    assert to_turn(request(reasoning={"effort": "high"}), [], "think").job.chat_template_kwargs == {
        "enable_thinking": True
    }
    # A model that does not reason takes any effort (agents always send one) and does not think.
    assert to_turn(request(reasoning={"effort": "high"}), [], "none").job.chat_template_kwargs is None
    assert to_turn(request(reasoning={"effort": "none"}), [], "none").job.chat_template_kwargs is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": 1}}}, "text.format.schema"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "extra": 1}}},
            "text.format.extra",
        ),
        ({"tool_choice": "auto"}, "tool_choice"),
    ],
)
def test_rules_between_fields_name_the_field(body, param):
    with pytest.raises(APIError) as caught:
        to_turn(request(**body), [], "think")
    assert caught.value.param == param and caught.value.message.startswith(param)


@pytest.mark.parametrize(
    "body, loc",
    [
        ({"conversation": "c"}, ("conversation",)),
        ({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]}, ("input", 0)),
        ({"input": [{"role": "user", "content": [HIGH_DETAIL]}]}, ("input", 0, "content", 0, "detail")),
        ({"tools": [{"type": "file_search"}]}, ("tools", 0, "type")),
        ({"tools": [{"type": "function", "name": "bad name"}]}, ("tools", 0, "name")),
        ({"metadata": {"k": "v" * 513}}, ("metadata",)),
        ({"input": ""}, ("input",)),
    ],
)  # fmt: skip
def test_validation_names_the_field(body, loc):
    with pytest.raises(ValidationError) as caught:
        request(**body)
    assert caught.value.errors()[0]["loc"] == loc


GEN_TEXT = "<think>hmm</think>\n\nHello there!"
TOKENS = ["<think>", "hmm", "</think>", "\n\n", "Hello", " there", "!"]


def generation(finish: str = "end_id") -> Generation:
    tokens = [Token(i, t, -0.5, False) for i, t in enumerate(TOKENS)]
    return Generation(text=GEN_TEXT, tokens=tokens, finish_reason=finish, prompt_tokens=9, cached_tokens=4)


def test_whole_response_parses_in_the_sdk():
    gen = generation()
    body = whole(Envelope(request(), "m"), Output(reply_reader(None, None, "hermes", "think"), 0), gen)
    resp = Response.model_validate(body)
    assert resp.output_text == "Hello there!" and resp.status == "completed"
    assert [i.type for i in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == "hmm"
    assert resp.usage.input_tokens_details.cached_tokens == 4
    assert resp.usage.output_tokens_details.reasoning_tokens == 3 == reasoning_tokens(gen, "hmm")
    assert len(resp.output[1].content[0].logprobs) == len(TOKENS)
    cut = whole(
        Envelope(request(), "m"), Output(reply_reader(None, None, "hermes", "think")), generation("length")
    )
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_streamed_pieces_build_the_whole_output_and_their_events():
    reader = reply_reader(None, None, "hermes", "think")
    output, events = Output(reader, 0), []
    for i, token in enumerate(TOKENS):
        part = reader.feed(token)
        if i == len(TOKENS) - 1:
            part += reader.finish()
        events += output.feed(part, [Token(i, token, -0.5, False)])
    events += output.finish("completed")
    whole_output = Output(reply_reader(None, None, "hermes", "think"), 0)
    whole(Envelope(request(), "m"), whole_output, generation())
    strip = [{k: v for k, v in item.items() if k != "id"} for item in output.items]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in whole_output.items]
    kinds = [e["type"] for e in events]
    assert kinds[:3] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
    ]
    assert kinds[-3:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "Hello there!"
    assert sum(
        len(e.get("logprobs", [])) for e in events if e["type"] == "response.output_text.delta"
    ) <= len(TOKENS)


def test_store_evicts_the_least_recently_created():
    store = ResponseStore(2)
    for name in ("a", "b", "c"):
        store.put(Stored({"id": name}, []))
        store.get(name if name != "c" else "b")  # reading does not refresh
    assert len(store) == 2
    with pytest.raises(APIError) as caught:
        store.get("a")
    assert caught.value.status == 404 and caught.value.param is None
    with pytest.raises(APIError) as caught:
        store.get("a", "previous_response_id")
    assert caught.value.code == "previous_response_not_found" and caught.value.param == "previous_response_id"
    store.delete("b")
    assert len(store) == 1
    empty = ResponseStore(0)
    empty.put(Stored({"id": "x"}, []))
    assert len(empty) == 0
