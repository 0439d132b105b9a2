"""Tool-call parsers, one module per format. Each reads a reply's text as it streams and splits it
into content and `CallEvent`s; `feed` and `finish` hold back nothing a later chunk could change
(a partial tag is kept until it is known to be one or not)."""

from __future__ import annotations

from typing import Protocol

from frontend.chat_tools.call_json import CallEvent


class ToolParser(Protocol):
    def feed(self, text: str) -> tuple[str, list[CallEvent]]: ...

    def finish(self) -> tuple[str, list[CallEvent]]: ...


def held_prefix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (to hold back: the tag may follow)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parser_names() -> tuple[str, ...]:
    return ("hermes", "llama3_json", "deepseek")


def make_parser(name: str) -> ToolParser:
    """A parser of a model's own tool-call format, for `tool_choice` auto."""
    if name == "hermes":
        from frontend.chat_tools.parsers.hermes import HermesParser

        return HermesParser()
    if name == "llama3_json":
        from frontend.chat_tools.parsers.json_calls import Llama3JsonParser

        return Llama3JsonParser()
    if name == "deepseek":
        from frontend.chat_tools.parsers.deepseek import DeepSeekParser

        return DeepSeekParser()
    raise ValueError(f"unknown tool parser {name!r}; one of {', '.join(parser_names())}")
