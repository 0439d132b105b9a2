"""Reading a chat template for tools and thinking, and writing tools into a conversation whose
template knows none (as TGI does)."""

from __future__ import annotations

import json

from tritonlm.model_gen.tiny import CHAT_TEMPLATE
from tritonlm.text import chat_format

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = "{%- if tools %}Environment: ipython{% endif %}<|python_tag|>{{ messages }}"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_parsers_from_the_template():
    assert chat_format.tool_parser(CHAT_TEMPLATE) == "hermes"
    assert chat_format.reasoning_parser(CHAT_TEMPLATE) == "think"
    assert chat_format.supports_tools(CHAT_TEMPLATE) and not chat_format.supports_tools(CHATML)
    assert chat_format.tool_parser(CHATML) == "hermes"  # the tools are injected in Hermes' format
    assert chat_format.reasoning_parser(CHATML) == "none"
    assert chat_format.tool_parser(LLAMA3) == "llama3_json"
    assert chat_format.tool_parser("{% if tools %}<｜tool▁calls▁begin｜>{% endif %}") == "deepseek"


def test_tools_written_into_a_conversation():
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
         "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
    ]  # fmt: skip
    out = chat_format.with_tools_in_messages(history, [TOOL])
    assert out[0]["role"] == "system" and json.dumps(TOOL) in out[0]["content"]
    assert "<tool_call>" in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    }
    assert out[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    system = chat_format.with_tools_in_messages(
        [{"role": "system", "content": "Be brief."}, *history], [TOOL]
    )
    assert system[0]["content"].startswith("Be brief.\n\n# Tools")


def test_a_tool_round_without_tools_is_text_and_lists_no_tools():
    """tool_choice "none" after a tool round: the history renders, the tools stay hidden."""
    history = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
         "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
    ]  # fmt: skip
    out = chat_format.with_tools_in_messages(history, [])
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert all(isinstance(m["content"], str) for m in out)
    assert "# Tools" not in json.dumps(out)


def test_arguments_strings_become_objects_for_templates():
    calls = [{"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    (message,) = chat_format.arguments_as_objects([{"role": "assistant", "tool_calls": calls}])
    assert message["tool_calls"][0]["function"]["arguments"] == {"a": 1}
