"""Reasoning split: `<think>…</think>` (Qwen3, DeepSeek-R1, the tiny model) before the answer.

The thought is `reasoning_content`, the rest `content`. A reply starts inside the thought when the
prompt opened it (DeepSeek-R1's template, or `enable_thinking: true` on a template that opens it);
otherwise a reply that begins with `<think>` opens it. Partial tags are held back while streaming.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontend.chat_tools.parsers import held_prefix

OPEN, CLOSE = "<think>", "</think>"


@dataclass
class ThinkSplitter:
    in_thought: bool = False  # the prompt opened the thought
    _state: str = ""  # "start" (may open), "thought", "after" (it closed), "answer"
    _buffer: str = ""

    def __post_init__(self) -> None:
        self._state = "thought" if self.in_thought else "start"

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of the new text."""
        self._buffer += text
        reasoning, content = "", ""
        while self._buffer:
            if self._state == "start":
                stripped = self._buffer.lstrip()
                if not stripped or (OPEN.startswith(stripped) and stripped != OPEN):
                    break  # maybe the opening tag
                if stripped.startswith(OPEN):
                    self._buffer, self._state = stripped[len(OPEN) :], "thought"
                else:
                    self._state = "answer"
                continue
            if self._state == "after":  # the blank lines between thought and answer
                self._buffer = self._buffer.lstrip("\n")
                if not self._buffer:
                    break
                self._state = "answer"
            if self._state == "answer":
                content += self._buffer
                self._buffer = ""
                break
            if self.in_thought and not reasoning and self._buffer.lstrip().startswith(OPEN):
                self._buffer = self._buffer.lstrip()[len(OPEN) :]  # a model that writes the tag again
            at = self._buffer.find(CLOSE)
            if at < 0:
                keep = held_prefix(self._buffer, CLOSE)
                reasoning += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            reasoning += self._buffer[:at]
            self._buffer = self._buffer[at + len(CLOSE) :]
            self._state = "after"
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        rest, self._buffer = self._buffer, ""
        return (rest, "") if self._state == "thought" else ("", rest)


# OpenAI's `reasoning_effort` values, the least first; the first two turn thinking off.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_NO_THOUGHT = ("none", "minimal")


def effort_kwargs(effort: str | None, reasoning_parser: str) -> dict[str, object]:
    """The chat template kwargs `reasoning_effort` sets: the templates' thinking switch,
    `enable_thinking`, false for none and minimal, true for low to max (there is no thinking budget
    to scale). A model that does not reason (reasoning parser `none`) takes any effort unchanged,
    as vLLM does (clients and agents send one to every model)."""
    if effort is None or reasoning_parser == "none":
        return {}
    return {"enable_thinking": effort not in _NO_THOUGHT}
