"""BlockManager: allocation, freeing, reference counts, prefix hashing and reuse, fork + copy-on-write,
rollback of rejected proposals, embedding rows in prefix keys."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import sequence

from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.request import PromptEmbeds
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.sampler import SamplingParams


def seq(tokens, max_new: int = 8) -> Sequence:
    return sequence(list(tokens), max_new, SamplingParams())


def admit(bm: BlockManager, s: Sequence) -> int:
    """What the scheduler does for a whole prompt: take cached blocks, allocate the rest, register."""
    hits = bm.lookup(s)
    assert bm.can_allocate(s, hits, s.num_tokens - len(hits) * bm.block_size)
    cached = bm.allocate(s, hits)
    bm.append_slots(s, s.num_tokens - cached)
    bm.cache_full_blocks(s, s.num_tokens)
    s.num_computed = s.num_tokens
    return cached


def test_allocate_and_free_return_every_block():
    bm = BlockManager(8, 4)
    a, b = seq(range(10)), seq(range(100, 105))
    assert admit(bm, a) == 0 and admit(bm, b) == 0
    assert len(a.block_table) == 3 and len(b.block_table) == 2
    assert len(set(a.block_table) | set(b.block_table)) == 5
    assert bm.num_free == 3 and bm.stats().blocks_used == 5
    bm.free(a)
    bm.free(b)
    assert bm.num_free == 8 and bm.stats().blocks_used == 0
    assert a.block_table == [] and a.num_computed == 0
    assert all(r == 0 for r in bm.ref_count)


def test_append_slot_takes_a_block_only_at_a_boundary():
    bm = BlockManager(8, 4)
    s = seq(range(4))
    admit(bm, s)
    assert bm.blocks_needed(s, 1) == 1  # block 0 is full: the 5th token needs a new one
    bm.append_slots(s, 1)
    s.output_ids.append(9)
    s.num_computed += 1
    assert len(s.block_table) == 2
    assert bm.blocks_needed(s, 1) == 0 and bm.blocks_needed(s, 4) == 1


def test_can_allocate_and_can_append_respect_the_free_blocks():
    bm = BlockManager(3, 4)
    a = seq(range(8))
    admit(bm, a)
    b = seq(range(50, 59))  # 3 blocks
    assert not bm.can_allocate(b, [], 9)
    assert bm.can_allocate(b, [], 4)
    assert bm.can_append(a, 4) and not bm.can_append(a, 5)


def test_full_blocks_are_hashed_with_their_prefix_and_reused():
    bm = BlockManager(16, 4)
    system = list(range(1, 13))  # three full blocks
    a = seq(system + [50, 51])
    admit(bm, a)
    b = seq(system + [60])
    assert admit(bm, b) == 12  # all three full blocks came from the cache
    assert b.block_table[:3] == a.block_table[:3]
    assert [bm.ref_count[x] for x in a.block_table[:3]] == [2, 2, 2]
    assert bm.ref_count[a.block_table[3]] == 1 and b.block_table[3] != a.block_table[3]
    stats = bm.stats()
    assert (stats.prefix_queries, stats.prefix_hits) == (14 + 13, 12)

    # Same tokens in block 2 but a different block before it: a different prefix, no reuse there.
    c = seq([99] + system[1:] + [70])
    assert admit(bm, c) == 0


def test_the_last_token_is_never_taken_from_the_cache():
    bm = BlockManager(16, 4)
    a = seq(range(8))  # exactly two blocks
    admit(bm, a)
    b = seq(range(8))
    assert admit(bm, b) == 4  # the second block holds the last token: computed again
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_freed_prefix_stays_cached_until_evicted_lru():
    bm = BlockManager(4, 4)
    a = seq(range(1, 9))  # 2 blocks, both full
    admit(bm, a)
    bm.free(a)
    assert bm.num_free == 4 and bm.stats().blocks_cached == 2
    again = seq(list(range(1, 9)) + [77])
    assert admit(bm, again) == 8
    bm.free(again)
    # Fill the whole pool with an unrelated sequence: the cached blocks are evicted, last block first.
    other = seq(range(100, 113))  # 4 blocks
    admit(bm, other)
    assert bm.stats().blocks_cached == 0
    assert admit_lookup_tokens(bm, seq(list(range(1, 9)) + [77])) == 0


def admit_lookup_tokens(bm: BlockManager, s: Sequence) -> int:
    return len(bm.lookup(s)) * bm.block_size


def test_eviction_prefers_plain_free_blocks_and_then_the_oldest_prefix():
    bm = BlockManager(4, 2)
    first, second = seq([1, 2, 3]), seq([7, 8, 9])
    admit(bm, first)
    admit(bm, second)
    bm.free(first)  # its full block [1, 2] is cached, released first
    bm.free(second)  # [7, 8] cached, released later
    x = seq([40, 41, 42, 43, 44])  # needs 3 blocks: 2 plain free ones, then the oldest cached
    admit(bm, x)
    assert admit_lookup_tokens(bm, seq([1, 2, 3])) == 0
    assert admit_lookup_tokens(bm, seq([7, 8, 9])) == 2


def test_prefix_caching_off_and_prompt_logits_skip_the_cache():
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    admit(bm, seq(range(9)))
    assert admit(bm, seq(range(9))) == 0
    bm = BlockManager(8, 4)
    admit(bm, seq(range(9)))
    wants = seq(range(9))
    wants.params.return_context_logits = True
    assert admit(bm, wants) == 0


def test_fork_shares_blocks_and_copies_a_shared_partial_block_on_write():
    bm = BlockManager(8, 4)
    parent = seq(range(6))  # block 0 full, block 1 holds 2 of 4
    admit(bm, parent)
    child = seq(range(6))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table and child.num_computed == 6
    assert all(bm.ref_count[b] == 2 for b in parent.block_table)

    # The child writes its 7th token into the shared, partially filled block: it gets a copy.
    assert bm.blocks_needed(child, 1) == 1
    bm.append_slots(child, 1)
    copies = bm.take_pending_copies()
    assert copies == [(parent.block_table[1], child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0] and child.block_table[1] != parent.block_table[1]
    assert bm.ref_count[parent.block_table[0]] == 2 and bm.ref_count[parent.block_table[1]] == 1
    # The parent now owns its last block alone: no copy for it.
    assert bm.blocks_needed(parent, 1) == 0
    bm.append_slots(parent, 1)
    assert bm.take_pending_copies() == []

    bm.free(child)
    bm.free(parent)
    assert bm.num_free == 8 and all(r == 0 for r in bm.ref_count)


def test_fork_at_a_block_boundary_needs_no_copy():
    bm = BlockManager(8, 4)
    parent = seq(range(8))
    admit(bm, parent)
    child = seq(range(8))
    bm.fork(parent, child)
    bm.append_slots(child, 1)
    assert bm.take_pending_copies() == [] and len(child.block_table) == 3


def test_reset_prefix_cache_forgets_every_prefix():
    bm = BlockManager(8, 4)
    a = seq(range(9))
    admit(bm, a)
    bm.free(a)
    bm.reset_prefix_cache()
    assert bm.stats().blocks_cached == 0 and bm.num_free == 8
    assert admit_lookup_tokens(bm, seq(range(9))) == 0


def test_release_more_often_than_taken_is_caught():
    bm = BlockManager(2, 4)
    with pytest.raises(AssertionError):
        bm._release(0)


def test_rollback_gives_back_exactly_the_slots_of_rejected_tokens():
    bm = BlockManager(8, 4)
    s = seq(range(6))
    admit(bm, s)
    s.output_ids.append(40)  # pending at position 6
    before = bm.stats()
    table = list(s.block_table)
    s.spec_tokens = [41, 42, 43, 44, 45]
    bm.append_slots(s, 6)  # positions 6..11: a third block
    s.num_computed += 6
    assert bm.stats().blocks_used == before.blocks_used + 1
    s.output_ids.append(50)  # every proposal rejected; the model's own token instead
    bm.rollback(s, 5)
    assert s.num_computed == 7 and s.spec_tokens == [] and s.block_table == table
    assert bm.stats() == before
    freed = [b for b in range(8) if b not in table]
    assert all(bm.ref_count[b] == 0 and bm.block_key[b] is None for b in freed)
    bm.free(s)
    assert bm.num_free == 8 and all(r == 0 for r in bm.ref_count)


def test_rollback_with_everything_accepted_keeps_the_slots():
    bm = BlockManager(8, 4)
    s = seq(range(3))
    admit(bm, s)
    s.output_ids.append(40)
    s.spec_tokens = [41, 42]
    bm.append_slots(s, 3)
    s.num_computed += 3
    s.output_ids.extend([41, 42, 43])
    bm.rollback(s, 0)
    assert s.num_computed == 6 and s.num_tokens == 7 and len(s.block_table) == 2 and s.spec_tokens == []


def test_proposals_are_never_registered_and_rollback_stays_out_of_cached_blocks():
    bm = BlockManager(8, 4)
    s = seq(range(6))
    admit(bm, s)
    s.output_ids.append(40)
    s.spec_tokens = [41, 42, 43, 44, 45]
    bm.append_slots(s, 6)
    bm.cache_full_blocks(s, 12)  # capped at the 7 verified tokens: block 0 only
    assert len(bm.cached) == 1 and len(s.block_hashes) == 1
    s.num_computed += 6
    with pytest.raises(AssertionError):
        bm.rollback(s, 9)  # would reopen block 0, which others may read from the prefix cache


def test_embedding_rows_key_their_blocks_by_content():
    rows = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    placeholders = [0, 1, 2, 0, 0, 0, 6, 7, 8]  # positions 3..5 carry rows

    def with_rows(r):
        return sequence(placeholders, 4, SamplingParams(), prompt_embeds=PromptEmbeds.of([3, 4, 5], r))

    bm = BlockManager(16, 4)
    admit(bm, with_rows(rows))
    assert admit(bm, with_rows(rows.clone())) == 8  # same rows: both full blocks shared
    assert admit(bm, with_rows(rows + 1)) == 0  # other rows, same placeholder ids: block 0 differs
    other = rows.clone()
    other[2] += 1  # only position 5 (block 1) differs
    assert admit(bm, with_rows(other)) == 4
    assert admit(bm, seq(placeholders)) == 0  # the bare placeholder ids are no match either
