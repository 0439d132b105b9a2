"""Hermes / Qwen2.5 / Qwen3 tool calls: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`,
one block per call, anywhere in the reply; the text outside the blocks is content. A block that is
not a call stays content, tags and all."""

from __future__ import annotations

from dataclasses import dataclass, field

from frontend.chat_tools.call_json import CallEvent, CallText
from frontend.chat_tools.parsers import held_prefix

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class HermesParser:
    calls: int = 0  # calls announced so far
    _buffer: str = ""  # text not yet given out
    _call: CallText | None = None  # the open block's call
    _body: str = ""  # the open block's text so far
    _pending: list[CallEvent] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[CallEvent]]:
        self._buffer += text
        content: list[str] = []
        events: list[CallEvent] = []
        while self._buffer:
            if self._call is None:
                at = self._buffer.find(OPEN)
                if at < 0:
                    keep = held_prefix(self._buffer, OPEN)
                    content.append(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                content.append(self._buffer[:at])
                self._buffer = self._buffer[at + len(OPEN) :]
                self._call, self._body = CallText(self.calls), ""
                continue
            at = self._buffer.find(CLOSE)
            if at < 0:
                keep = held_prefix(self._buffer, CLOSE)
                events += self._body_text(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            events += self._body_text(self._buffer[:at])
            self._buffer = self._buffer[at + len(CLOSE) :]
            done, text_back = self._close()
            events += done
            content.append(text_back)
        return "".join(content), events

    def finish(self) -> tuple[str, list[CallEvent]]:
        if self._call is None:
            rest, self._buffer = self._buffer, ""
            return rest, []
        events = self._body_text(self._buffer)
        self._buffer = ""
        done, text_back = self._close(closed=False)
        return text_back, events + done

    def _body_text(self, text: str) -> list[CallEvent]:
        assert self._call is not None
        self._body += text
        return self._counted(self._call.feed(text))

    def _close(self, closed: bool = True) -> tuple[list[CallEvent], str]:
        """The block ended: its last events, or its text as content when it is not a call."""
        assert self._call is not None
        events, valid = self._call.close()
        events = self._counted(events)
        text_back = "" if valid else OPEN + self._body + (CLOSE if closed else "")
        self._call = None
        return events, text_back

    def _counted(self, events: list[CallEvent]) -> list[CallEvent]:
        self.calls += sum(1 for e in events if e.name is not None)
        return events
