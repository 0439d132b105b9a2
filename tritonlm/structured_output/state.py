"""One sequence's grammar: an xgrammar matcher that follows the sequence's output tokens."""

from __future__ import annotations

from concurrent.futures import Future

import torch
import xgrammar as xgr


class GrammarState:
    """Created when the request arrives, with its grammar still compiling (`ready` says when it is
    done). The engine loop alone uses the matcher.

    `stop_ids` (the end id and the one-token stop words) may end the output once the grammar is
    complete, and only then; with none, the grammar's completion itself ends it (`terminated`).
    The matcher is kept in step with the output by `sync`, so whatever happened to the sequence
    (a preemption and recompute keeps its tokens; a rollback removes some), it matches the tokens.
    """

    def __init__(self, compiled: Future[xgr.CompiledGrammar], stop_ids: list[int]):
        self.compiled = compiled
        self.stop_ids = stop_ids
        self._matcher: xgr.GrammarMatcher | None = None
        self.accepted = 0  # output tokens the matcher has taken

    @property
    def ready(self) -> bool:
        return self.compiled.done()

    @property
    def matcher(self) -> xgr.GrammarMatcher:
        if self._matcher is None:
            self._matcher = xgr.GrammarMatcher(
                self.compiled.result(),
                override_stop_tokens=self.stop_ids or None,
                terminate_without_stop_token=not self.stop_ids,
            )
        return self._matcher

    def sync(self, output_ids: list[int]) -> bool:
        """Brings the matcher to `output_ids`; False when a token breaks the grammar (it stays
        unaccepted)."""
        matcher = self.matcher
        if len(output_ids) < self.accepted:  # tokens were taken back
            matcher.rollback(self.accepted - len(output_ids))
            self.accepted = len(output_ids)
        while self.accepted < len(output_ids):
            if not matcher.accept_token(output_ids[self.accepted]):
                return False
            self.accepted += 1
        return True

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes the tokens allowed next into `bitmask[row]`."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    @property
    def terminated(self) -> bool:
        """The grammar accepted a stop token, or (without stop tokens) is complete."""
        return self._matcher is not None and self._matcher.is_terminated()
