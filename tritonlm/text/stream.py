"""One generated sequence's text, made once: incremental detokenization, then the stop strings.

The engine keeps one `TextStream` per sequence whose client wants text or set stop strings: it feeds
each new token on the engine loop, learns there whether a stop string completed (the sequence then
finishes with "stop_words"), and the text it returns is the response's `text_output`. Postprocessing
(the ensemble's last step) runs the same class per beam on the engine's responses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tritonlm.text.detokenizer import IncrementalDetokenizer, StopStringFilter


def stop_texts(tokenizer: Any, stop_strings: Iterable[str], stop_words: Iterable[Sequence[int]]) -> list[str]:
    """The texts that end a generation: the stop strings, and the text of each stop word given as
    token ids (so a word the model spells with other tokens stops it too)."""
    decoded = (tokenizer.decode(list(word)) for word in stop_words)
    return list(dict.fromkeys(s for s in (*stop_strings, *decoded) if s))


class TextStream:
    """Token ids in, the text safe to show out.

    The concatenation of every `add` and the final `finish` is the decoded text, cut at the first
    stop string (kept with `include_stop`). Stop strings are looked for only in the text of the
    tokens from the `armed_at`-th on (the request's min_length: no stop before it), so text made
    before passes through at once.
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        stop_strings: Sequence[str] = (),
        include_stop: bool = False,
        armed_at: int = 0,
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens)
        self._filter = StopStringFilter(stop_strings, include_stop)
        self._armed_at = armed_at
        self._tokens = 0

    @property
    def stopped(self) -> bool:
        """A stop string completed: nothing more comes out."""
        return self._filter.stopped

    @property
    def matched(self) -> str:
        """The stop string that stopped the text, else ""."""
        return self._filter.matched

    def add(self, ids: Sequence[int]) -> str:
        self._tokens += len(ids)
        text = self._detokenizer.add(ids)
        return self._filter.push(text) if self._tokens >= self._armed_at else text

    def finish(self) -> str:
        """The held-back text, once the sequence is done."""
        return self._filter.push(self._detokenizer.flush()) + self._filter.flush()
