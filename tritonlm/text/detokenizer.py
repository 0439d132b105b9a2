"""Streaming text from token ids: incremental detokenization and stop-string filtering.

Decoding token by token is wrong for two reasons: one character can span several tokens (byte-level
BPE, SentencePiece byte fallback), and a token's text can depend on its neighbours (SentencePiece
drops the leading space of the first token). So `IncrementalDetokenizer` decodes a short window of
recent tokens twice, with and without the unread ones, and emits the difference once it is final.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

REPLACEMENT = "\ufffd"  # what decoders produce for an incomplete or invalid UTF-8 sequence
# SentencePiece byte-fallback tokens; the ByteFallback decoder joins a run of them into one UTF-8
# string, or into one U+FFFD per byte if the run is invalid, so a run's text is final only when it ends.
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# Held-back tokens beyond which text is released even if it might still change. Text that is valid
# UTF-8 and not one huge run of byte tokens never gets there; the limit keeps each step O(window)
# when a model emits long stretches of invalid bytes.
HOLD_LIMIT = 64


def _backend(tokenizer: Any) -> Any | None:
    """The `tokenizers.Tokenizer` behind a fast tokenizer, or None for a pure-Python one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if hasattr(backend, "get_added_tokens_decoder") else None


def _uses_byte_fallback(backend: Any | None) -> bool:
    decoder = getattr(backend, "decoder", None)
    if decoder is None:
        return False
    try:
        state = decoder.__getstate__()  # the decoder's JSON, without the vocabulary
    except Exception:  # an unknown decoder: assume the worst, it only adds latency
        return True
    return b"ByteFallback" in (state if isinstance(state, bytes) else str(state).encode())


def skipped_ids(tokenizer: Any) -> frozenset[int]:
    """Ids that `decode(..., skip_special_tokens=True)` removes before decoding."""
    backend = _backend(tokenizer)
    if backend is not None:  # the backend skips exactly its added tokens marked special
        return frozenset(i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
    return frozenset(tokenizer.all_special_ids)


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of text.

    The concatenation of every `add` result and the final `flush` equals
    `tokenizer.decode(all_ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)`.
    (Space clean-up rewrites text across token boundaries, so it cannot be streamed; transformers
    leaves it off by default.) Each step decodes only the tokens since the last emitted boundary.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        backend = _backend(tokenizer)
        self._decode: Callable[[list[int]], str]
        if backend is not None:  # the Rust decoder directly: same text, less per-call overhead
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
            self._id_to_token: Callable[[int], str | None] = backend.id_to_token
        else:
            self._decode = lambda ids: tokenizer.decode(
                ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
            )
            self._id_to_token = tokenizer.convert_ids_to_tokens
        # Skipped tokens vanish before the decoder runs, so dropping them early changes nothing
        # and stops a run of them from growing the window.
        self._drop = skipped_ids(tokenizer) if skip_special_tokens else frozenset()
        self._byte_fallback = _uses_byte_fallback(backend) if backend is not None else True
        # The window: ids[0:read] were emitted; decode(ids[0:read]) == prefix_text. The window
        # always starts with an emitted token so that "first token" rules (SentencePiece's leading
        # space) apply to text already emitted, never to new text.
        self._ids: list[int] = []
        self._read = 0
        self._prefix_text = ""

    def add(self, new_ids: Sequence[int]) -> str:
        """Appends token ids; returns the text that became final (possibly "")."""
        ids = [int(i) for i in new_ids if int(i) not in self._drop]
        if not ids:
            return ""
        self._ids.extend(ids)
        return self._step(final=False)

    def flush(self) -> str:
        """Returns the text still held back (an unfinished character ends up as U+FFFD)."""
        return self._step(final=True)

    @property
    def window_size(self) -> int:
        """Ids decoded per step: the last emitted batch plus the held-back ones."""
        return len(self._ids)

    def _step(self, final: bool) -> str:
        if len(self._ids) == self._read:
            return ""
        release = (len(self._ids), self._decode(self._ids)) if final else self._final_prefix()
        if release is None:
            return ""
        end, text = release
        if len(text) <= len(self._prefix_text):
            # Nothing visible yet (e.g. SentencePiece's lone "▁" at the start): keep the window.
            return ""
        new_text = text[len(self._prefix_text) :]
        # The next window starts at the first token of this step, which now carries emitted text.
        self._ids, self._read = self._ids[self._read :], end - self._read
        self._prefix_text = self._decode(self._ids[: self._read])
        return new_text

    def _final_prefix(self) -> tuple[int, str] | None:
        """(end, decode(ids[:end])) for the longest window prefix whose text is final, or None."""
        end = len(self._ids)
        if self._byte_fallback:  # a run of byte tokens decodes as a whole: stop before the last run
            while end > self._read and self._is_byte_token(self._ids[end - 1]):
                end -= 1
        if end > self._read:
            text = self._decode(self._ids[:end])
            if not text.endswith(REPLACEMENT):  # else an unfinished character (or invalid bytes)
                return end, text
        if len(self._ids) - self._read <= HOLD_LIMIT:
            return None
        # Only very long runs of byte tokens or of invalid UTF-8 get here: release them to keep the
        # window bounded, cutting at a character boundary when one is near the end.
        for end in range(len(self._ids), len(self._ids) - 4, -1):
            text = self._decode(self._ids[:end])
            if not text.endswith(REPLACEMENT):
                return end, text
        return len(self._ids), self._decode(self._ids)

    def _is_byte_token(self, token_id: int) -> bool:
        token = self._id_to_token(token_id)
        return token is not None and _BYTE_TOKEN.fullmatch(token) is not None


class StopStringFilter:
    """Cuts a text stream at the first stop string, never emitting text that might start one.

    `push` returns the text that is safe to show; `stopped` turns True once a stop string is
    complete (the text before it, or up to its end with `include_stop`, has then been returned and
    everything after is dropped). `flush` releases held-back text when the stream ends unstopped.
    """

    def __init__(self, stop_strings: Sequence[str], include_stop: bool = False) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stop_strings if s))  # "" would stop at once
        self._include_stop = include_stop
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False
        self.matched = ""  # the stop string that stopped the stream

    def push(self, piece: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return piece
        text = self._held + piece
        match = self._first_stop(text)
        if match is not None:
            start, end = match
            self.stopped = True
            self.matched = text[start:end]
            self._held = ""
            return text[: end if self._include_stop else start]
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self._held = ("" if self.stopped else self._held), ""
        return held

    def _first_stop(self, text: str) -> tuple[int, int] | None:
        """(start, end) of the stop string that completes first; earlier start wins a tie."""
        best: tuple[int, int] | None = None
        for stop in self._stops:
            start = text.find(stop)
            if start < 0:
                continue
            end = start + len(stop)
            if best is None or (end, start) < (best[1], best[0]):
                best = (start, end)
        return best

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        for n in range(min(len(text), self._longest - 1), 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self._stops):
                return n
        return 0
