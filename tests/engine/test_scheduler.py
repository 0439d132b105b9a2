"""Scheduler without a model: token budget, chunked prefill, admission, preemption order, queue bound,
decodes with proposals."""

from __future__ import annotations

from engine_helpers import sequence

from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler, SchedulerOutput
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.sampler import SamplingParams


def seq(n_prompt: int, max_new: int = 50, start: int = 0) -> Sequence:
    return sequence(list(range(start, start + n_prompt)), max_new, SamplingParams())


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, queue=0) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, budget, queue)


def run_step(s: Scheduler) -> SchedulerOutput:
    """Schedules a step and plays the engine's part: compute, then sample where the chunk ends."""
    batch = s.schedule()
    flags = batch.sample
    for q, n in zip(batch.seqs, batch.num_new, strict=True):
        q.num_computed += n
    for q, flag in zip(batch.seqs, flags, strict=True):
        if flag:
            q.output_ids.append(1000 + len(q.output_ids))
            if len(q.output_ids) >= q.request.max_new_tokens:
                s.finish(q)
    return batch


def test_decodes_come_first_then_chunks_within_the_budget():
    s = make(budget=10)
    a = seq(3)
    s.add(a)
    run_step(s)  # a's prompt
    b = seq(25, start=100)
    s.add(b)
    batch = run_step(s)
    assert batch.seqs == [a, b] and batch.num_new == [1, 9]  # one decode, then 9 of b's 25 tokens
    assert len(b.output_ids) == 0 and b.num_computed == 9
    batch = run_step(s)
    assert batch.num_new == [1, 9] and b.num_computed == 18 and not b.output_ids
    batch = run_step(s)
    assert batch.num_new == [1, 7] and b.num_computed == 25 and len(b.output_ids) == 1  # sampled
    assert run_step(s).num_new == [1, 1]


def test_only_the_chunk_that_reaches_the_end_is_sampled():
    s = make(budget=8)
    a = seq(20)
    s.add(a)
    flags = []
    while not a.output_ids:
        batch = s.schedule()
        flags.append(batch.sample)
        for q, n in zip(batch.seqs, batch.num_new, strict=True):
            q.num_computed += n
        if flags[-1][0]:
            a.output_ids.append(1)
    assert flags == [[False], [False], [True]]


def test_max_num_seqs_caps_running_and_fifo_admission():
    s = make(max_num_seqs=2)
    seqs = [seq(3, start=10 * i) for i in range(4)]
    for q in seqs:
        s.add(q)
    batch = run_step(s)
    assert batch.seqs == seqs[:2] and list(s.waiting) == seqs[2:]
    s.finish(seqs[0])
    batch = run_step(s)
    assert batch.seqs == [seqs[1], seqs[2]]


def test_waiting_queue_bound():
    s = make(max_num_seqs=2, queue=2)
    # Two for the free running places, two for the queue.
    assert all(s.add(seq(3)) for _ in range(4))
    assert not s.add(seq(3))
    assert len(s.waiting) == 4
    run_step(s)  # two admitted: the queue holds two, nothing is free
    assert not s.add(seq(3))
    s.finish(s.running[0])  # a running place is free again
    assert s.add(seq(3))


def test_preemption_takes_the_newest_and_requeues_it_first():
    # 6 blocks of 4 tokens; three prompts of 8 tokens fill them.
    s = make(num_blocks=6, block_size=4, budget=64)
    a, b, c = seq(8, start=0), seq(8, start=100), seq(8, start=200)
    for q in (a, b, c):
        s.add(q)
    run_step(s)
    assert s.running == [a, b, c] and s.blocks.num_free == 0
    # Each feeds its 9th token next, which needs a new block: c (the newest) makes room.
    batch = run_step(s)
    assert batch.preempted == [c] and s.running == [a, b] and list(s.waiting) == [c]
    assert batch.seqs == [a, b]
    assert c.block_table == [] and c.num_computed == 0 and c.num_preemptions == 1
    assert s.num_preemptions == 1
    # Two victims in one step go back in their original order (the older first).
    s2 = make(num_blocks=4, block_size=4, budget=64)
    w, x, y, z = (seq(4, start=100 * i) for i in range(4))
    for q in (w, x, y, z):
        s2.add(q)
    run_step(s2)  # one full block each
    batch = run_step(s2)  # w needs a block: z goes; x needs one: y goes
    assert batch.seqs == [w, x] and batch.preempted == [z, y] and list(s2.waiting) == [y, z]


def test_a_decode_without_anyone_newer_preempts_itself():
    s = make(num_blocks=4, block_size=4, budget=64)
    a, b = seq(7), seq(8, start=100)
    s.add(a)
    s.add(b)
    run_step(s)  # a: 2 blocks, b: 2 blocks, pool full
    batch = run_step(s)  # a's 8th token fits; b needs a 3rd block: b is the newest, it yields
    assert batch.seqs == [a] and batch.preempted == [b]


def test_preempted_sequence_is_recomputed_with_its_outputs():
    s = make(num_blocks=6, block_size=4, budget=64, max_num_seqs=4)
    a, b, c = seq(8, start=0), seq(8, start=100), seq(8, start=200)
    for q in (a, b, c):
        s.add(q)
    run_step(s)
    run_step(s)  # c preempted with 1 output token
    assert c.num_tokens == 9 and list(s.waiting) == [c]
    s.finish(a)  # blocks come back
    batch = run_step(s)
    i = batch.seqs.index(c)
    # Its freed blocks went to a and b: prompt and output token are computed again, and it is
    # sampled at the end of the recompute.
    assert batch.num_new[i] == 9 and c.num_computed == 9 and len(c.output_ids) == 2
    assert c.out.cached_tokens == 0  # reported from its first admission only


def test_no_admission_in_a_step_that_preempted():
    s = make(num_blocks=4, block_size=4, budget=64)
    a, b = seq(8), seq(8, start=100)
    s.add(a)
    s.add(b)
    run_step(s)
    late = seq(2, start=500)
    s.add(late)
    batch = run_step(s)
    assert batch.preempted == [b] and late not in batch.seqs


def test_an_older_prefill_preempts_newer_sequences_for_its_chunk():
    s = make(num_blocks=4, block_size=4, budget=64)
    older, newer = seq(12, start=0), seq(10, start=100)
    s.blocks.allocate(older, [])
    s.blocks.append_slots(older, 4)  # 4 of its 12 prompt tokens computed: 1 block
    older.num_computed = 4
    s.blocks.allocate(newer, [])
    s.blocks.append_slots(newer, 10)  # prompt done, decoding: 3 blocks, the pool is full
    newer.num_computed = 10
    newer.output_ids.append(7)
    s.running = [older, newer]
    batch = s.schedule()
    # The newer decode was scheduled first, then given up for the older one's chunk.
    assert batch.preempted == [newer] and batch.seqs == [older] and batch.num_new == [8]


def test_prefix_hits_count_as_computed_and_are_reported():
    s = make(num_blocks=32, block_size=4)
    a = seq(13)
    s.add(a)
    run_step(s)
    b = seq(13)
    s.add(b)
    batch = run_step(s)
    i = batch.seqs.index(b)
    assert b.out.cached_tokens == 12 and batch.num_new[i] == 1


def test_same_step_admissions_share_a_prefix_being_computed():
    s = make(num_blocks=32, block_size=4)
    a, b = seq(13), seq(13)
    s.add(a)
    s.add(b)
    batch = run_step(s)
    assert batch.num_new == [13, 1] and b.out.cached_tokens == 12
    assert b.block_table[:3] == a.block_table[:3]


def feed(batch: SchedulerOutput) -> None:
    """The forward's part: every scheduled token is computed."""
    for q, n in zip(batch.seqs, batch.num_new, strict=True):
        q.num_computed += n


def test_a_decode_feeds_its_proposals_all_or_waits_for_room():
    s = make(budget=6)
    a, b = seq(3), seq(3, start=100)
    s.add(a)
    s.add(b)
    run_step(s)  # both prompts, one token each: both decoding
    b.spec_tokens = [1, 2, 3, 4]
    batch = s.schedule()
    assert batch.seqs == [a, b] and batch.num_new == [1, 5]
    assert batch.sample == [True, True] and batch.num_logits == [1, 5]
    assert len(b.block_table) == 2  # positions 3..7 of 4-token blocks
    feed(batch)
    # Verified: b's first two proposals kept, then its own token; the other two given back.
    a.output_ids.append(5)
    b.output_ids.extend([1, 2, 9])
    s.blocks.rollback(b, 2)
    assert b.num_computed == 6 and b.num_tokens == 7 and b.spec_tokens == []
    a.spec_tokens = [6, 7]
    b.spec_tokens = [1, 2, 3, 4]
    batch = s.schedule()
    # a takes 3 of the 6; b's 5 do not fit the 3 left, so none of them go: it waits, proposals kept.
    assert batch.seqs == [a] and batch.num_new == [3]
    assert b.spec_tokens == [1, 2, 3, 4] and b.num_computed == 6 and len(b.block_table) == 2


def test_proposals_that_could_never_fit_a_step_are_dropped():
    s = make(budget=4)
    a = seq(3)
    s.add(a)
    run_step(s)
    a.spec_tokens = [1, 2, 3, 4]  # 5 tokens with the pending one: over any step's budget
    batch = s.schedule()
    assert batch.num_new == [1] and a.spec_tokens == []


def test_proposals_that_do_not_fit_the_free_blocks_never_preempt():
    s = make(num_blocks=2, block_size=4)
    a, b = seq(3), seq(3, start=100)
    s.add(a)
    s.add(b)
    run_step(s)  # one block each: the pool is full; each feeds position 3 next, in its block
    a.spec_tokens = [1, 2]  # positions 4 and 5 would need a third block
    batch = s.schedule()
    assert batch.seqs == [a, b] and batch.num_new == [1, 1] and not batch.preempted
    assert a.spec_tokens == []


def test_a_preempted_sequence_drops_its_proposals():
    s = make(num_blocks=4, block_size=4)
    a, b = seq(8), seq(6, start=100)
    s.add(a)
    s.add(b)
    run_step(s)  # two blocks each; a's next token needs a third
    b.spec_tokens = [1]
    batch = s.schedule()
    assert batch.preempted == [b] and b.spec_tokens == [] and list(s.waiting) == [b]


def test_prefix_blocks_are_registered_up_to_verified_tokens_only():
    s = make(num_blocks=16, block_size=4)
    a = seq(6)
    s.add(a)
    run_step(s)  # prompt: block 0 full and registered; one output token, pending at position 6
    a.spec_tokens = [7, 8, 9, 10, 11]  # positions 7..11: block 1 would end with a proposal
    feed(s.schedule())
    assert len(a.block_hashes) == 1 and len(s.blocks.cached) == 1
    a.output_ids.extend([7, 99])  # the first proposal accepted, then the model's own token
    s.blocks.rollback(a, 4)
    assert a.num_computed == 8 and len(a.block_table) == 2
    s.schedule()  # block 1 (positions 4..7) is verified now: registered with the next step
    assert len(a.block_hashes) == 2 and len(s.blocks.cached) == 2
    twin = seq(6)
    twin.output_ids.extend([a.output_ids[0], 7, 99])
    assert s.blocks.lookup(twin) == a.block_table[:2]
