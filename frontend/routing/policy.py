"""Which replica takes a request: least outstanding requests, with prefix affinity, healthy ones only.

Pure bookkeeping (no I/O, no clock), so it is unit-tested alone. The idea follows the cache-aware
policies of sglang-router and vLLM's production-stack router, in a simpler form: a prompt is cut
into fixed blocks of token ids, each block's hash chained to the one before (as a prefix cache keys
its blocks), and each replica remembers the block hashes of the prompts it was sent (bounded, least
recently used out). A prompt whose leading blocks a replica has seen goes there -- its prefix cache
probably holds them -- unless that replica is busier than the least loaded one by more than
`imbalance`, where load wins. Everything else goes to the replica with fewest requests in flight.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hashes(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """Chained hashes of the prompt's full blocks: equal lists up to k mean equal first k blocks."""
    result: list[bytes] = []
    previous = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = ",".join(str(int(t)) for t in tokens[start : start + block_size]).encode()
        previous = hashlib.blake2b(previous + block, digest_size=12).digest()
        result.append(previous)
    return result


@dataclass
class ReplicaState:
    name: str
    healthy: bool = True
    outstanding: int = 0
    routed: int = 0
    seen: OrderedDict[bytes, None] = field(default_factory=OrderedDict)

    def matched_blocks(self, hashes: Sequence[bytes]) -> int:
        count = 0
        for digest in hashes:
            if digest not in self.seen:
                break
            count += 1
        return count

    def remember(self, hashes: Sequence[bytes], capacity: int) -> None:
        for digest in hashes:
            self.seen[digest] = None
            self.seen.move_to_end(digest)
        while len(self.seen) > capacity:
            self.seen.popitem(last=False)


@dataclass(frozen=True)
class Choice:
    replica: str
    affinity: bool  # chosen because it has seen this prompt's prefix


class Policy:
    """`block_size`: tokens per hashed block; `min_blocks`: leading blocks a replica must share with
    a prompt for affinity to count (short shared prefixes, e.g. a chat template's header, do not
    pin traffic); `imbalance`: extra requests in flight tolerated on the affine replica;
    `capacity`: block hashes remembered per replica."""

    def __init__(
        self, block_size: int = 16, min_blocks: int = 2, imbalance: int = 4, capacity: int = 100_000
    ) -> None:
        self.block_size = block_size
        self.min_blocks = min_blocks
        self.imbalance = imbalance
        self.capacity = capacity
        self.replicas: dict[str, ReplicaState] = {}

    def set_replicas(self, names: Sequence[str]) -> None:
        """Add new replicas, drop those no longer listed (their remembered prefixes go with them)."""
        for name in names:
            self.replicas.setdefault(name, ReplicaState(name))
        for name in list(self.replicas):
            if name not in names:
                del self.replicas[name]

    def mark(self, name: str, healthy: bool) -> None:
        state = self.replicas.get(name)
        if state is not None:
            state.healthy = healthy
            if not healthy:
                state.seen.clear()  # a restarted server starts with an empty prefix cache

    def choose(self, tokens: Sequence[int] | None = None, exclude: Sequence[str] = ()) -> Choice | None:
        """The replica for a request (None when no healthy one is left); `tokens`: the prompt's ids
        when known (affinity), `exclude`: replicas already tried for this request."""
        candidates = [s for s in self.replicas.values() if s.healthy and s.name not in exclude]
        if not candidates:
            return None
        least = min(candidates, key=lambda s: (s.outstanding, s.routed))
        hashes = block_hashes(tokens, self.block_size) if tokens is not None else []
        chosen, affinity = least, False
        if len(hashes) >= self.min_blocks:
            best = max(candidates, key=lambda s: (s.matched_blocks(hashes), -s.outstanding))
            matched = best.matched_blocks(hashes)
            if matched >= self.min_blocks and best.outstanding <= least.outstanding + self.imbalance:
                chosen, affinity = best, True
        chosen.remember(hashes, self.capacity)
        return Choice(chosen.name, affinity)

    def started(self, name: str) -> None:
        state = self.replicas.get(name)
        if state is not None:
            state.outstanding += 1
            state.routed += 1

    def finished(self, name: str) -> None:
        state = self.replicas.get(name)
        if state is not None:
            state.outstanding = max(0, state.outstanding - 1)
