"""Tool-call and reasoning parsers on recorded replies of each format, whole and streamed in
chunks of every size (tags split across chunks)."""

from __future__ import annotations

import json

import pytest

from frontend.chat_tools.parsers import make_parser
from frontend.chat_tools.parsers.json_calls import JsonCallsParser, NamedCallParser
from frontend.chat_tools.reasoning import ThinkSplitter
from frontend.chat_tools.reply import ReplyReader, tool_call_deltas, tool_calls_json

HERMES = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
    '"days": [1, 2], "note": "a } and <b> in text"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
)
QWEN3 = (
    "<think>\nThe user wants weather.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
LLAMA3 = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
DEEPSEEK = (
    "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n'
    "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
REQUIRED = (
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_time", "arguments": {"tz": "CET"}}]'
)


def read(reader: ReplyReader, text: str, size: int) -> tuple[str, str, list, list]:
    """(reasoning, content, whole-reply calls, stream deltas) of `text` fed in chunks of `size`."""
    reasoning, content, events, deltas = "", "", [], []
    chunks = [text[i : i + size] for i in range(0, len(text), size)] if size else [text]
    for part in [*chunks, None]:
        d = reader.feed(part) if part is not None else reader.finish()
        reasoning, content = reasoning + d.reasoning, content + d.content
        events += d.calls
        deltas += tool_call_deltas(d.calls, reader)
    return reasoning, content, tool_calls_json(events, reader), deltas


def streamed_arguments(deltas: list) -> dict[int, str]:
    out: dict[int, str] = {}
    for d in deltas:
        out[d["index"]] = out.get(d["index"], "") + d["function"].get("arguments", "")
    return out


@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 7, 11, 64])
def test_hermes_calls_whole_and_streamed(size: int) -> None:
    reasoning, content, calls, deltas = read(ReplyReader(tools=make_parser("hermes")), HERMES, size)
    assert content == "Let me check.\n\n"  # tags never leak into content
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    args = json.loads(calls[0]["function"]["arguments"])
    assert args == {"city": "Paris", "days": [1, 2], "note": "a } and <b> in text"}
    assert calls[1]["function"]["arguments"] == "{}"
    # The first delta of a call names it; the fragments concatenate to the whole arguments.
    firsts = [d for d in deltas if "id" in d]
    assert [(d["index"], d["type"], d["function"]["name"]) for d in firsts] == [
        (0, "function", "get_weather"),
        (1, "function", "get_time"),
    ]
    assert streamed_arguments(deltas) == {i: c["function"]["arguments"] for i, c in enumerate(calls)}


@pytest.mark.parametrize("size", [0, 1, 4])
def test_hermes_plain_text_and_broken_block(size: int) -> None:
    text = "a < b and <tool_ca"
    assert read(ReplyReader(tools=make_parser("hermes")), text, size)[1] == text
    broken = "x <tool_call>\nnot json\n</tool_call> y"
    _, content, calls, _ = read(ReplyReader(tools=make_parser("hermes")), broken, size)
    assert content == broken and calls == []


@pytest.mark.parametrize("size", [0, 1, 3, 9])
def test_hermes_other_key_order(size: int) -> None:
    text = '<tool_call>{"arguments": {"q": 1}, "name": "f"}</tool_call>'
    _, content, calls, deltas = read(ReplyReader(tools=make_parser("hermes")), text, size)
    assert content == "" and calls[0]["function"] == {"name": "f", "arguments": '{"q": 1}'}
    assert streamed_arguments(deltas) == {0: '{"q": 1}'}


@pytest.mark.parametrize("size", [0, 1, 2, 6])
def test_reasoning_then_tool_call(size: int) -> None:
    reader = ReplyReader(thinking=ThinkSplitter(), tools=make_parser("hermes"))
    reasoning, content, calls, _ = read(reader, QWEN3, size)
    assert reasoning == "\nThe user wants weather.\n"
    assert content.strip() == ""
    assert calls[0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("size", [0, 1, 2, 5])
def test_reasoning_split(size: int) -> None:
    # The prompt opened the thought (DeepSeek-R1, enable_thinking true on the tiny model).
    r, c, _, _ = read(ReplyReader(thinking=ThinkSplitter(in_thought=True)), "hmm</think>\n\nAnswer", size)
    assert (r, c) == ("hmm", "Answer")
    # Qwen3: the model opens it itself; a reply without the tag is all answer.
    r, c, _, _ = read(ReplyReader(thinking=ThinkSplitter()), "<think>a</think>b", size)
    assert (r, c) == ("a", "b")
    r, c, _, _ = read(ReplyReader(thinking=ThinkSplitter()), "<thin and more", size)
    assert (r, c) == ("", "<thin and more")
    # Cut off while thinking: all of it is thought.
    r, c, _, _ = read(ReplyReader(thinking=ThinkSplitter(in_thought=True)), "still </thi", size)
    assert (r, c) == ("still </thi", "")


@pytest.mark.parametrize("size", [0, 1, 4])
def test_llama3_json(size: int) -> None:
    _, content, calls, deltas = read(ReplyReader(tools=make_parser("llama3_json")), LLAMA3, size)
    assert content == "" and calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert streamed_arguments(deltas) == {0: '{"city": "Paris"}'}
    assert read(ReplyReader(tools=make_parser("llama3_json")), "Hello {x}", size)[1] == "Hello {x}"


@pytest.mark.parametrize("size", [0, 1, 7])
def test_guided_outputs(size: int) -> None:
    _, _, calls, deltas = read(ReplyReader(tools=JsonCallsParser()), REQUIRED, size)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "CET"}),
    ]
    assert streamed_arguments(deltas) == {0: '{"city": "Paris"}', 1: '{"tz": "CET"}'}
    _, _, calls, _ = read(ReplyReader(tools=JsonCallsParser()), REQUIRED[1:-1].split(", {")[0], size)
    assert calls[0]["function"]["name"] == "get_weather"
    _, _, calls, deltas = read(ReplyReader(tools=NamedCallParser("f")), ' {"a": [1, "}"]}', size)
    assert calls[0]["function"] == {"name": "f", "arguments": '{"a": [1, "}"]}'}


@pytest.mark.parametrize("size", [0, 1, 2, 5, 13])
def test_deepseek_calls(size: int) -> None:
    _, content, calls, deltas = read(ReplyReader(tools=make_parser("deepseek")), DEEPSEEK, size)
    assert content == "Sure."
    assert [c["function"] for c in calls] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"name": "get_time", "arguments": "{}"},
    ]
    assert streamed_arguments(deltas) == {0: '{"city": "Paris"}', 1: "{}"}
