"""Sliding windows on every layer (`BlockManager.window`): blocks wholly behind the window of a
sequence's next query are released while it runs, so a decoding sequence holds at most
ceil(W / block) + 1 blocks, whatever its length; reference counts and the free count stay right
through chunked prefill, proposals and their rollback, forks, preemption, prefix hits and finish.
No model here: the scheduler plays the engine's part (test_scheduler's `run_step`)."""

from __future__ import annotations

import pytest
from engine_helpers import sequence
from test_scheduler import run_step

from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.sampler import SamplingParams

W = 16


def seq(n_prompt: int, max_new: int, start: int = 0) -> Sequence:
    return sequence(list(range(start, start + n_prompt)), max_new, SamplingParams())


def make(num_blocks: int = 64, block_size: int = 4, budget: int = 64, max_num_seqs: int = 8) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size, window=W), max_num_seqs, budget)


def bound(bm: BlockManager, fed: int = 1) -> int:
    """The most blocks a sequence feeding `fed` tokens may hold: W - 1 + fed positions (the window
    behind its first, and them) span at most this many blocks."""
    return -(-(W - 2 + fed) // bm.block_size) + 1


def check(s: Scheduler) -> None:
    """Every live entry is counted once per table holding it, every released one lies wholly behind
    its sequence's window, and the free count is what nobody holds."""
    bm = s.blocks
    counts = [0] * bm.num_blocks
    for q in s.running:
        for i, block in enumerate(q.block_table):
            if block == bm.null_block:
                assert (i + 1) * bm.block_size <= q.num_computed - bm.window + 1, (i, q.num_computed)
            else:
                counts[block] += 1
    assert counts == bm.ref_count
    assert bm.num_free == sum(1 for c in counts if c == 0)


def released_at(q: Sequence, n: int, block_size: int) -> int:
    """Blocks wholly behind the window of the query at position num_computed - n, counted by hand:
    its window is positions [num_computed - n - W + 1, num_computed - n]."""
    first = q.num_computed - n
    return sum(1 for i in range(len(q.block_table)) if (i + 1) * block_size <= first - W + 1)


def drain(s: Scheduler) -> int:
    """Runs every sequence to its end, checking the bound and the counts each step; returns the most
    blocks a decoding sequence held."""
    most = 0
    while s.has_work():
        batch = run_step(s)
        for q, n in zip(batch.seqs, batch.num_new, strict=True):
            if not q.finished:
                assert s.blocks.held(q) <= bound(s.blocks, n), (q.num_computed, n, q.block_table)
                # the step's first query, at num_computed - n, read its whole window
                released = q.block_table.count(s.blocks.null_block)
                expected = released_at(q, n, s.blocks.block_size)
                assert released == s.blocks.behind_window(q.num_computed - n) == expected
                if n == 1:
                    most = max(most, s.blocks.held(q))
        check(s)
    return most


@pytest.mark.parametrize("block_size", [4, 5, 8])
def test_a_sequence_of_eight_windows_holds_at_most_the_window_in_blocks(block_size):
    s = make(block_size=block_size, budget=8)  # chunked prefill: 8 tokens a step
    a = seq(3 * W, max_new=5 * W)  # 8·W tokens in all
    s.add(a)
    assert drain(s) == bound(s.blocks) <= -(-W // block_size) + 1  # the bound
    assert s.blocks.num_free == s.blocks.num_blocks and not any(s.blocks.ref_count)


def test_without_a_window_nothing_is_released():
    s = Scheduler(BlockManager(64, 4), 8, 64)
    a = seq(10, max_new=40)
    s.add(a)
    while a.num_tokens < 40:
        run_step(s)
    assert s.blocks.held(a) == len(a.block_table) == -(-a.num_computed // 4)


def test_the_cache_serves_more_sequences_than_it_holds_whole():
    """Eight sequences of 8·W tokens in a cache of 40 blocks of 4 (160 positions): without the window
    each would need 32 blocks; released behind it, all run at once and none is preempted."""
    s = make(num_blocks=40, budget=16)
    for i in range(8):
        s.add(seq(W, max_new=7 * W, start=1000 * i))
    drain(s)
    assert s.num_preemptions == 0
    assert s.blocks.num_free == 40


def test_rejected_proposals_roll_back_inside_the_window():
    s = make()
    a = seq(3 * W, max_new=4 * W)
    s.add(a)
    while a.num_tokens < 4 * W:
        run_step(s)
    for _ in range(6):  # decodes verifying 3 proposals, 2 of them rejected each time
        a.spec_tokens = [1, 2, 3]
        batch = run_step(s)  # the pending token and 3 proposals; one token appended
        assert batch.num_new == [4] and s.blocks.held(a) <= bound(s.blocks, 4)
        a.output_ids.append(7)  # the accepted proposal
        s.blocks.rollback(a, 2)
        assert a.num_computed == a.num_tokens - 1
        check(s)
    drain(s)
    assert s.blocks.num_free == s.blocks.num_blocks


def test_forked_beams_share_the_blocks_inside_the_window():
    s = make()
    parent = seq(3 * W + 2, max_new=6 * W)
    s.add(parent)
    while parent.num_tokens < 5 * W + 2:  # off a block boundary: the fork shares a partial block
        run_step(s)
    released = parent.block_table.count(s.blocks.null_block)
    assert released > 0
    child = Sequence(parent.request, output_ids=list(parent.output_ids))
    s.fork(parent, child)
    assert child.block_table == parent.block_table
    check(s)
    batch = run_step(s)  # both write into the shared partial block: one copies it
    assert len(batch.copies) == 1
    check(s)
    drain(s)
    assert s.blocks.num_free == s.blocks.num_blocks and not any(s.blocks.ref_count)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_preempted_sequence_is_recomputed_into_fresh_blocks(prefix_caching):
    s = Scheduler(BlockManager(64, 4, prefix_caching, window=W), 8, 8)
    a, b = seq(W, max_new=6 * W), seq(W, max_new=6 * W, start=500)
    s.add(a)
    s.add(b)
    while b.num_tokens < 4 * W:
        run_step(s)
    s.preempt(b)
    assert b.block_table == [] and b.num_computed == 0
    check(s)
    run_step(s)  # readmitted: with the prefix cache, its blocks in the window are hits
    # ... else it computes its tokens again from position 0, a chunk a step, into fresh blocks
    assert (b.block_table[0] == s.blocks.null_block) == prefix_caching
    assert (b.num_computed > 8) == prefix_caching
    check(s)
    drain(s)
    assert s.blocks.num_free == 64 and not any(s.blocks.ref_count)


def test_a_prefix_hit_takes_only_the_blocks_inside_the_window():
    bm = BlockManager(64, 4, window=8)
    s = Scheduler(bm, 8, 64)
    a = seq(40, max_new=10)
    s.add(a)
    run_step(s)  # a's prompt: 10 blocks, registered
    run_step(s)  # a's first decode: its blocks behind the window are released, still cached
    assert a.block_table[0] == bm.null_block and bm.stats().blocks_cached > 0
    b = seq(40, max_new=10)
    hits = bm.lookup(b)
    assert len(hits) == 9  # the whole chain from position 0 (the last token is computed)
    free = bm.num_free
    assert bm.can_allocate(b, hits, 4)
    assert bm.allocate(b, hits) == 36
    dead = bm.behind_window(36)  # its first query at 36 reads positions 29..36 only
    assert b.block_table == [bm.null_block] * dead + hits[dead:]
    assert bm.num_free == free - sum(1 for h in hits[dead:] if h not in a.block_table)
    bm.append_slots(b, 4)
    bm.cache_full_blocks(b, 40)  # the released entries are skipped, their hashes kept
    assert len(b.block_hashes) == 10
    s.running.append(b)
    check(s)
    bm.free(a)
    bm.free(b)
    assert bm.num_free == 64 and not any(bm.ref_count)


def test_a_window_is_at_least_one_position():
    with pytest.raises(ValueError, match="sliding window"):
        BlockManager(8, 4, window=0)
