"""DeepSeek V3 / R1 tool calls:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {…arguments…}
    ```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>

The text before the calls block is content; the arguments stream as they come (the closing
fence is held back until it is known to be one)."""

from __future__ import annotations

from dataclasses import dataclass

from frontend.chat_tools.call_json import CallEvent
from frontend.chat_tools.parsers import held_prefix

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "```json\n", "\n```"


@dataclass
class DeepSeekParser:
    calls: int = 0
    _state: str = "content"  # content, between (calls), head (type and name), args, after (the call)
    _buffer: str = ""

    def feed(self, text: str) -> tuple[str, list[CallEvent]]:
        self._buffer += text
        content, events = "", []
        while True:
            before = (self._state, len(self._buffer))
            if self._state == "content":
                at = self._buffer.find(CALLS_BEGIN)
                if at < 0:
                    keep = held_prefix(self._buffer, CALLS_BEGIN)
                    content += self._buffer[: len(self._buffer) - keep]
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                else:
                    content += self._buffer[:at]
                    self._buffer, self._state = self._buffer[at + len(CALLS_BEGIN) :], "between"
            elif self._state == "between":
                stripped = self._buffer.lstrip()
                if stripped.startswith(CALL_BEGIN):
                    self._buffer, self._state = stripped[len(CALL_BEGIN) :], "head"
                elif stripped.startswith(CALLS_END):
                    self._buffer, self._state = stripped[len(CALLS_END) :], "content"
            elif self._state == "head":
                sep = self._buffer.find(SEP)
                fence = self._buffer.find(FENCE_OPEN, sep + 1) if sep >= 0 else -1
                if fence >= 0:
                    name = self._buffer[sep + len(SEP) : fence].strip()
                    events.append(CallEvent(self.calls, name=name))
                    self._buffer, self._state = self._buffer[fence + len(FENCE_OPEN) :], "args"
            elif self._state == "args":
                at = self._buffer.find(FENCE_CLOSE)
                end = at if at >= 0 else len(self._buffer) - held_prefix(self._buffer, FENCE_CLOSE)
                if end:
                    events.append(CallEvent(self.calls, arguments=self._buffer[:end]))
                self._buffer = self._buffer[end:]
                if at >= 0:
                    self._buffer, self._state = self._buffer[len(FENCE_CLOSE) :], "after"
            elif self._state == "after":
                at = self._buffer.find(CALL_END)
                if at >= 0:
                    self._buffer, self._state = self._buffer[at + len(CALL_END) :], "between"
                    self.calls += 1
            if (self._state, len(self._buffer)) == before:
                return content, events

    def finish(self) -> tuple[str, list[CallEvent]]:
        content, events = self.feed("")
        if self._state == "content":
            content, self._buffer = content + self._buffer, ""
        elif self._state == "args" and self._buffer:
            events.append(CallEvent(self.calls, arguments=self._buffer))
        return content, events
