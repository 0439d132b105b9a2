"""Tool-call JSON read as it streams: `{"name": …, "arguments": {…}}` objects, one after another
(inside a format's tags, or a JSON list of them).

A `CallText` reports a call's name once it is complete, then the raw text of its `arguments` value
in fragments as they arrive. A stream and a whole text are read by the same code, so the fragments
of a stream concatenate to exactly the arguments of the whole reply.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

# The canonical order (what templates and the guided schema produce): name first, then arguments.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)')
_DECODER = json.JSONDecoder()


@dataclass
class CallEvent:
    """A call's first event carries `name` (and its `index` in the reply); later ones fragments of
    `arguments`."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass
class CallText:
    """One call's JSON text."""

    index: int
    text: str = ""
    name: str | None = None
    sent: int = 0  # characters of the arguments reported
    args_start: int | None = None
    closed: bool = False

    def feed(self, text: str) -> list[CallEvent]:
        self.text += text
        events: list[CallEvent] = []
        if self.name is None and (head := _HEAD.match(self.text)):
            self.name = json.loads(head.group(1))
            self.args_start = head.end()
            events.append(CallEvent(self.index, name=self.name))
        if self.args_start is not None:
            raw = self._arguments_so_far()
            if raw is not None and len(raw) > self.sent:
                events.append(CallEvent(self.index, arguments=raw[self.sent :]))
                self.sent = len(raw)
        return events

    def _arguments_so_far(self) -> str | None:
        """The arguments text that is certainly part of the value: all of it once the value is
        complete; while an object is still open, what has come (its end is not known yet)."""
        assert self.args_start is not None
        rest = self.text[self.args_start :]
        try:
            _, end = _DECODER.raw_decode(rest)
            return rest[:end]
        except json.JSONDecodeError:
            return rest if rest.startswith("{") else None

    def close(self) -> tuple[list[CallEvent], bool]:
        """The call's text is complete: (the last events, whether it was a valid call). A call in
        another key order is parsed only now."""
        self.closed = True
        try:
            obj = json.loads(self.text)
        except json.JSONDecodeError:
            return [], self.name is not None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return [], self.name is not None
        args = obj.get("arguments", obj.get("parameters", {}))
        if self.name is not None:  # streamed already: the raw text, complete now
            return self.feed(""), True
        self.name = obj["name"]
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        self.sent = len(text)
        return [CallEvent(self.index, name=self.name), CallEvent(self.index, arguments=text)], True


@dataclass
class ObjectSplitter:
    """Splits a stream of JSON text into its top-level objects (a list's items, or objects one
    after another): `feed` gives (object index, text) pieces; text between objects is dropped."""

    _depth: int = 0
    _in_string: bool = False
    _escape: bool = False
    _list: bool = False
    count: int = 0  # objects begun
    done: list[int] = field(default_factory=list)  # indices of closed objects

    def feed(self, text: str) -> list[tuple[int, str]]:
        pieces: list[tuple[int, str]] = []
        base = 1 if self._list else 0
        for char in text:
            inside = self._depth > base
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif char == "\\":
                    self._escape = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                if self._depth == 0 and char == "[" and not self.count:
                    self._list, base, self._depth = True, 1, 1
                    continue
                if self._depth == base:
                    self.count += 1
                    inside = True
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == base and inside:
                    self.done.append(self.count - 1)
            if inside:
                if pieces and pieces[-1][0] == self.count - 1:
                    pieces[-1] = (pieces[-1][0], pieces[-1][1] + char)
                else:
                    pieces.append((self.count - 1, char))
        return pieces
