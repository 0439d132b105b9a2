"""Chooses the work of each forward step: decodes, prefill chunks, admissions and preemptions.

Every step has a token budget (`max_num_batched_tokens`) and at most `max_num_seqs` sequences run
(hold KV blocks). A step takes, in this order:

1. every running sequence that is decoding (oldest first): its pending token, plus its proposed
   `spec_tokens` if it has any (all of them or, when they do not fit the budget, none: it waits;
   proposals that do not fit the free blocks are dropped rather than preempt anyone);
2. the next chunk of every running sequence still feeding its prompt (or recomputing after a
   preemption), as much of it as the budget allows;
3. waiting sequences, first come first served, while the budget, `max_num_seqs` and the free blocks
   allow; a prompt's blocks found in the prefix cache are taken instead of computed.

A chunk that reaches the prompt's end (2, 3) also feeds the sequence's proposals (a client's draft
tokens for its first generated tokens) when they fit the budget and the free blocks, else drops them.

So a long prompt is split over several steps and never holds the decoding streams up for more than
one budget's worth of tokens. A sequence is sampled only when its chunk reaches its last token; a
decode with proposals wants the logits of every token it feeds (`SchedulerOutput.num_logits`), to verify them.
Prefix-cache blocks are registered only up to a sequence's verified tokens, never over proposals;
rejected proposals give their slots back through `BlockManager.rollback`.

When a running sequence needs a block and none is free, the newest running sequence is preempted:
its blocks are released and it goes back to the front of the waiting queue, to be recomputed
(prompt and generated tokens, often mostly from the prefix cache) when blocks free up; its
proposals, if any, are dropped. Nothing it generated is lost, so its output is the same as if it
had never been interrupted.

`scheduling_policy` priority changes only the order (`rank`: lower `priority` first, then arrival):
the waiting queue and the running list are kept in rank order, so "first come" above reads "best
ranked" and "the newest" reads "the worst ranked"; and, before step 1, the best waiting sequence
that finds no running place or too few free blocks for its first chunk preempts worse-ranked
running sequences, worst first, until it fits.

With sliding windows on every layer (`BlockManager.window`), each step first releases the blocks
of every running sequence that lie wholly behind the window of its next query (`BlockManager.slide`),
so the step's allocations and admissions can use them.

The scheduler is not thread-safe: the engine calls it from its loop thread, `add` under its lock.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.sequence import Sequence, Status


@dataclass
class SchedulerOutput:
    """One step's work: feed `num_new[i]` tokens of `seqs[i]` (after copying the copy-on-write
    block pairs `copies`, and the recurrent-state slot pairs `state_copies`, in order); sample those
    with `sample[i]`."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    state_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def sample(self) -> list[bool]:
        """Whether the step reaches each sequence's last verified token (so its next is drawn)."""
        return [s.num_computed + n >= s.num_tokens for s, n in zip(self.seqs, self.num_new, strict=True)]

    @property
    def num_logits(self) -> list[int]:
        """Logits rows each sequence needs, from its last new token back: 0 when not sampled, 1 for
        a plain decode or a last prompt chunk, 1 + len(spec_tokens) for a decode with proposals
        (row j predicts the token after its j-th fed token)."""
        pairs = zip(self.seqs, self.num_new, strict=True)
        return [max(s.num_computed + n - s.num_tokens + 1, 0) for s, n in pairs]

    @property
    def prompt_logits(self) -> list[bool]:
        """Whether the step keeps the logits of every new token of each sequence (a request that
        reports prompt logits or prompt log probs, while it feeds its prompt)."""
        return [s.needs_prompt_logits and s.num_computed < len(s.prompt_ids) for s in self.seqs]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    def __len__(self) -> int:
        return len(self.seqs)

    def _add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_new.append(n)

    def _remove(self, seq: Sequence) -> int:
        """Takes `seq` out of the batch if it is in; returns the tokens it had been given."""
        for i, s in enumerate(self.seqs):
            if s is seq:
                del self.seqs[i]
                return self.num_new.pop(i)
        return 0


def rank(seq: Sequence) -> tuple[int, float]:
    """scheduling_policy priority's order, best first: lower `priority`, then earlier arrival."""
    return (seq.request.priority, seq.request.arrival)


def fit_proposals(seq: Sequence, n: int, budget: int, room: Callable[[int], bool]) -> int:
    """The tokens `seq` feeds: its `n` plus all its proposals when they fit both the token `budget`
    and the free blocks (`room(total)`: can the blocks take `total` new tokens); else `n`, and the
    proposals are dropped (they never cost a preemption)."""
    total = n + len(seq.spec_tokens)
    if total > n and total <= budget and room(total):
        return total
    seq.spec_tokens.clear()
    return n


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_queue_size: int = 0,
        policy: str = "fcfs",
    ):
        self.blocks = block_manager
        self.by_priority = policy == "priority"  # else fcfs (EngineConfig checks the name)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_queue_size = max_queue_size  # 0: unbounded
        self.waiting: deque[Sequence] = deque()
        # In admission order (by priority: rank order): the last is the newest (the worst ranked).
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def has_room(self, count: int = 1) -> bool:
        """Whether `count` more sequences may queue: the waiting queue holds `max_queue_size`
        sequences beyond those the free running places will take at the next step (so a burst that
        fits in those places is never refused)."""
        free_places = max(self.max_num_seqs - len(self.running), 0)
        return not self.max_queue_size or len(self.waiting) + count <= self.max_queue_size + free_places

    def add(self, seq: Sequence) -> bool:
        """Queues a new sequence; False (and nothing queued) when the waiting queue is full."""
        if not self.has_room():
            return False
        seq.status = Status.WAITING
        self._place(self.waiting, seq)
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def sequences(self) -> list[Sequence]:
        """Every sequence the scheduler holds, running ones first."""
        return [*self.running, *self.waiting]

    def finish(self, seq: Sequence) -> None:
        """Removes a finished (or cancelled) sequence, running or waiting, and frees its blocks."""
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq in self.running:  # running, or a beam awaiting its group
            self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.FINISHED

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Starts `child`, a copy of `parent` about to diverge from it (a beam), sharing the parent's
        KV blocks (copy-on-write); with no running place, or a parent without blocks (preempted),
        it waits first in line instead, to be recomputed (mostly from the prefix cache)."""
        if parent.block_table and len(self.running) < self.max_num_seqs and self.blocks.can_fork:
            self.blocks.fork(parent, child)
            child.status = Status.RUNNING
            self._place(self.running, child)
        else:
            child.num_computed = 0
            child.status = Status.WAITING
            self._place(self.waiting, child, first=True)

    def schedule(self) -> SchedulerOutput:
        batch = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bs = self.blocks.block_size
        for seq in self.running:  # blocks behind every layer's window are read no more
            self.blocks.slide(seq)
        self._make_room(batch)  # scheduling_policy priority: worse-ranked running sequences give way
        displaced = len(batch.preempted)

        # 1. Decodes, oldest first: the pending token and any proposals, all or nothing; a decode
        #    short of a block preempts the newest sequence.
        for seq in [s for s in self.running if s.num_tokens - s.num_computed == 1]:
            if budget == 0:
                break
            if not seq.block_table:  # preempted for an older one in this loop
                continue
            if len(seq.spec_tokens) >= self.max_num_batched_tokens:  # could never fit: drop them
                seq.spec_tokens.clear()
            if 1 + len(seq.spec_tokens) > budget:  # its proposals wait for room; younger decodes may fit
                continue
            # Proposals never cost a preemption: without the free blocks for them, they go.
            n = fit_proposals(seq, 1, budget, partial(self.blocks.can_append, seq))
            fits, freed = self._preempt_for(seq, n, batch)
            budget += freed
            if not fits:  # nothing newer to give way: it waits itself
                self._preempt(seq, batch)
                continue
            self.blocks.append_slots(seq, n)
            batch._add(seq, n)
            budget -= n

        # 2. Running sequences still feeding their prompt: the next chunk each, oldest first.
        for seq in [s for s in self.running if s.num_tokens - s.num_computed > 1]:
            if budget == 0:
                break
            if not seq.block_table:  # preempted for an older one in this loop
                continue
            n = min(seq.num_tokens - seq.num_computed, budget)
            fits, freed = self._preempt_for(seq, n, batch)
            budget += freed
            if not fits:  # nothing newer to give way: take the part that fits in the free blocks
                room = (len(seq.block_table) + self.blocks.num_free) * bs - seq.num_computed
                n = max(min(n, room), 0)
                if not self.blocks.can_append(seq, n):  # a copy-on-write needs one more
                    n = 0
            if n > 0:
                n = self._with_proposals(seq, n, budget)
                self.blocks.append_slots(seq, n)
                batch._add(seq, n)
                budget -= n
        # What the running sequences compute this step may serve the admissions below.
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            self.blocks.cache_full_blocks(seq, seq.num_computed + n)

        # 3. Admissions, first come first served (a sequence that does not fit holds the rest);
        #    none in a step that had to preempt for a running sequence: blocks are short already.
        short = len(batch.preempted) > displaced
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not short:
            seq = self.waiting[0]
            hits = self.blocks.lookup(seq)
            n = min(seq.num_tokens - len(hits) * bs, budget)
            if not self.blocks.can_allocate(seq, hits, n):
                break
            if seq.spec_tokens and n == seq.num_tokens - len(hits) * bs:  # its prompt's end: drafts too?
                n = fit_proposals(seq, n, budget, partial(self.blocks.can_allocate, seq, hits))
            self.waiting.popleft()
            cached = self.blocks.allocate(seq, hits)
            if not seq.num_preemptions:  # first admission: what the response reports
                seq.out.cached_tokens = cached
                seq.out.scheduled_at = seq.out.scheduled_at or time.perf_counter()
            self.blocks.append_slots(seq, n)
            seq.status = Status.RUNNING
            self._place(self.running, seq)
            batch._add(seq, n)
            budget -= n
            self.blocks.cache_full_blocks(seq, seq.num_computed + n)
        batch.copies = self.blocks.take_pending_copies()
        batch.state_copies = self.blocks.take_pending_state_copies()
        return batch

    def _make_room(self, batch: SchedulerOutput) -> None:
        """scheduling_policy priority: the best waiting sequence that would not be admitted (no
        running place, or too few free blocks for its first chunk) preempts the worst-ranked
        running sequences that rank below it, worst first, until it would."""
        if not self.by_priority or not self.waiting:
            return
        seq = self.waiting[0]
        while self.running and rank(self.running[-1]) > rank(seq) and not self._would_admit(seq):
            self._preempt(self.running[-1], batch)

    def _would_admit(self, seq: Sequence) -> bool:
        """A running place and the blocks for `seq`'s first chunk (a whole budget's at most) are free."""
        hits = self.blocks.lookup(seq)
        n = min(seq.num_tokens - len(hits) * self.blocks.block_size, self.max_num_batched_tokens)
        return len(self.running) < self.max_num_seqs and self.blocks.can_allocate(seq, hits, n)

    def _place(self, queue: deque[Sequence] | list[Sequence], seq: Sequence, first: bool = False) -> None:
        """Puts `seq` in the waiting queue or the running list: by priority, at its rank; else at the
        end, or `first` (a preempted sequence goes back to the front of the line)."""
        if self.by_priority:
            bisect.insort(queue, seq, key=rank)
        elif first:
            queue.appendleft(seq)
        else:
            queue.append(seq)

    def _with_proposals(self, seq: Sequence, n: int, budget: int) -> int:
        """A prompt chunk that reaches the prompt's end also feeds the proposals after it (a
        client's draft tokens), when they fit the budget and the free blocks; else they are dropped."""
        if not seq.spec_tokens or seq.num_computed + n < seq.num_tokens:
            return n
        return fit_proposals(seq, n, budget, partial(self.blocks.can_append, seq))

    def unblock_beams(self) -> None:
        """Every running place may be held by beams waiting for their groups' other beams, which
        wait for a place: preempt the newest (it is recomputed later) so the queue moves."""
        running = self.running
        if self.waiting and running and all(s.status is Status.AWAITING_BEAMS for s in running):
            self.preempt(running[-1])

    def _preempt_for(self, seq: Sequence, n: int, batch: SchedulerOutput) -> tuple[bool, int]:
        """Preempts the newest running sequences admitted after `seq` until `n` more of its tokens fit
        in the KV blocks. Returns whether they fit, and the tokens the preempted ones give back to
        this step's budget."""
        freed = 0
        while not self.blocks.can_append(seq, n):
            victim = self._newest_after(seq)
            if victim is None:
                return False, freed
            freed += self._preempt(victim, batch)
        return True, freed

    def _newest_after(self, seq: Sequence) -> Sequence | None:
        """The newest running sequence admitted after `seq`, if any."""
        newest = self.running[-1]
        return newest if newest is not seq else None

    def preempt(self, seq: Sequence) -> None:
        """Preempts a running sequence outside of scheduling (the engine's deadlock breaker)."""
        self._preempt(seq, SchedulerOutput())

    def _preempt(self, seq: Sequence, batch: SchedulerOutput) -> int:
        """Sends a running sequence back to the front of the waiting queue, without its blocks.
        Returns the tokens it had been given in this step's batch (0 if none)."""
        given = batch._remove(seq)
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        seq.spec_tokens.clear()  # proposals are for one step; it will feed its prompt again first
        self._place(self.waiting, seq, first=True)
        seq.num_preemptions += 1
        self.num_preemptions += 1
        batch.preempted.append(seq)
        return given
