"""Replies that are tool-call JSON: the guided output of `tool_choice` required (one call object,
or a list of them) or a named function (the arguments alone), and Llama 3's JSON format (a reply
that starts with `{` or `<|python_tag|>` is calls, `;`-separated objects; otherwise content)."""

from __future__ import annotations

from dataclasses import dataclass, field

from frontend.chat_tools.call_json import CallEvent, CallText, ObjectSplitter

PYTHON_TAG = "<|python_tag|>"


@dataclass
class JsonCallsParser:
    """Calls as JSON objects (`{"name", "arguments"}`), alone or in a list."""

    _splitter: ObjectSplitter = field(default_factory=ObjectSplitter)
    _calls: list[CallText] = field(default_factory=list)
    _closed: int = 0

    def feed(self, text: str) -> tuple[str, list[CallEvent]]:
        events: list[CallEvent] = []
        for index, piece in self._splitter.feed(text):
            while len(self._calls) <= index:
                self._calls.append(CallText(len(self._calls)))
            events += self._calls[index].feed(piece)
        while self._closed < len(self._splitter.done):
            events += self._calls[self._splitter.done[self._closed]].close()[0]
            self._closed += 1
        return "", events

    def finish(self) -> tuple[str, list[CallEvent]]:
        events: list[CallEvent] = []
        for call in self._calls:
            if not call.closed:
                events += call.close()[0]
        return "", events


@dataclass
class NamedCallParser:
    """The reply is the arguments of the one function `name` (guided by its parameters schema)."""

    name: str
    _started: bool = False

    def feed(self, text: str) -> tuple[str, list[CallEvent]]:
        events = []
        if not self._started:
            text = text.lstrip()
            if not text:
                return "", []
            self._started = True
            events.append(CallEvent(0, name=self.name))
        if text:
            events.append(CallEvent(0, arguments=text))
        return "", events

    def finish(self) -> tuple[str, list[CallEvent]]:
        if self._started:
            return "", []
        self._started = True
        return "", [CallEvent(0, name=self.name), CallEvent(0, arguments="{}")]


@dataclass
class Llama3JsonParser:
    """Llama 3.x: the whole reply is `{"name": …, "parameters": {…}}` (maybe after <|python_tag|>),
    several separated by `;`; a reply that starts otherwise is content."""

    _mode: str = ""  # "", "calls" or "content"
    _head: str = ""
    _calls: JsonCallsParser = field(default_factory=JsonCallsParser)

    def feed(self, text: str) -> tuple[str, list[CallEvent]]:
        if self._mode == "content":
            return text, []
        if self._mode == "calls":
            return self._calls.feed(text)
        self._head += text
        stripped = self._head.lstrip()
        if not stripped or (PYTHON_TAG.startswith(stripped) and stripped != PYTHON_TAG):
            return "", []  # not known yet
        if stripped.startswith(PYTHON_TAG):
            stripped = stripped[len(PYTHON_TAG) :]
            self._mode = "calls"
        elif stripped.startswith("{"):
            self._mode = "calls"
        else:
            self._mode = "content"
            head, self._head = self._head, ""
            return head, []
        self._head = ""
        return self._calls.feed(stripped)

    def finish(self) -> tuple[str, list[CallEvent]]:
        if self._mode == "calls":
            return self._calls.finish()
        head, self._head = self._head, ""
        return head, []
