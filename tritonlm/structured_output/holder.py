"""Requests whose grammar is compiling. They wait here, not in the scheduler's queue, so that one
slow guide holds no other request; each joins the queue once its grammar is compiled (at once when
it was cached), or fails alone (a bad guide is the client's mistake: the error names the guide
tensor; a full queue refuses it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, Protocol, TypeVar

from tritonlm.structured_output.grammars import Grammars, Guide
from tritonlm.structured_output.state import GrammarState

T = TypeVar("T")  # what waits: the engine's Sequence


class StopTokens(Protocol):
    """What the grammar reads of a request's sampling parameters (sampling.params.SamplingParams)."""

    end_id: int
    stop_token_ids: list[int]


class GrammarHolder(Generic[T]):
    """`join(item)` queues a compiled request and returns "" (or why it could not: the message it
    fails with); `fail(item, message)` ends it with an error. Both run on the compiling thread, or
    in `hold` when the grammar was cached."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        join: Callable[[T], str],
        fail: Callable[[T, str], None],
    ):
        # Compiling needs the tokenizer's vocabulary; without one, guided requests are refused.
        self.grammars = Grammars(tokenizer, vocab_size) if tokenizer is not None else None
        self.join = join
        self.fail = fail
        self.lock = threading.Lock()
        self.held: dict[int, T] = {}  # id(item) -> item, while its grammar compiles

    def grammar(self, guide: Guide, params: StopTokens) -> GrammarState:
        """A new sequence's grammar, compiling; the end id and one-token stop words may end it."""
        if self.grammars is None:
            raise RuntimeError("structured output needs the engine's tokenizer")
        stop_ids = ([params.end_id] if params.end_id >= 0 else []) + params.stop_token_ids
        return GrammarState(self.grammars.compile(guide.type, guide.text), stop_ids)

    def hold(self, item: T, grammar: GrammarState) -> None:
        """Keeps `item` until `grammar` is compiled, then joins or fails it."""
        with self.lock:
            self.held[id(item)] = item
        grammar.compiled.add_done_callback(lambda compiled: self._ready(item, compiled))

    def __len__(self) -> int:
        return len(self.held)

    def _ready(self, item: T, compiled: Future) -> None:
        with self.lock:
            self.held.pop(id(item), None)
        error = compiled.exception()
        message = str(error) if error is not None else self.join(item)
        if message:
            self.fail(item, message)

    def close(self) -> None:
        if self.grammars is not None:
            self.grammars.close()
