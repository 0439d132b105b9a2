"""scheduling_policy priority without a model: admission in rank order (lower priority first, ties
in arrival order), better-ranked arrivals displacing worse-ranked running sequences, decodes short of
a block preempting the worst ranked; and the engine's refusal of a priority under fcfs."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import sequence
from test_scheduler import run_step

from tritonlm.config import ConfigError, EngineConfig
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler, rank
from tritonlm.engine.sequence import Sequence
from tritonlm.serving.engine_inputs import InvalidRequest, parse_request


def seq(n_prompt: int, priority: int = 0, start: int = 0, max_new: int = 50) -> Sequence:
    return sequence(list(range(start, start + n_prompt)), max_new, priority=priority)


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, policy="priority") -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_num_seqs, budget, policy=policy)


def test_rank_is_priority_then_arrival():
    early_low, late_high, late_low = seq(2, priority=5), seq(2, priority=-1), seq(2, priority=5)
    assert sorted([late_low, early_low, late_high], key=rank) == [late_high, early_low, late_low]


def test_waiting_sequences_are_admitted_best_ranked_first():
    s = make(max_num_seqs=2)
    low, mid, high, mid2 = seq(3, 2), seq(3, 1, start=10), seq(3, 0, start=20), seq(3, 1, start=30)
    for q in (low, mid, high, mid2):
        s.add(q)
    assert list(s.waiting) == [high, mid, mid2, low]  # ties keep their arrival order
    batch = run_step(s)
    assert batch.seqs == [high, mid] and s.running == [high, mid] and list(s.waiting) == [mid2, low]


def test_fcfs_ignores_priorities():
    s = make(max_num_seqs=2, policy="fcfs")
    low, high = seq(3, 9), seq(3, 0, start=10)
    s.add(low)
    s.add(high)
    assert run_step(s).seqs == [low, high]


def test_a_better_arrival_takes_the_running_place_of_the_worst_ranked():
    s = make(max_num_seqs=2)
    a, b = seq(3, 5), seq(3, 7, start=10)
    s.add(a)
    s.add(b)
    run_step(s)
    high = seq(3, 0, start=20)
    s.add(high)
    batch = run_step(s)
    assert batch.preempted == [b] and batch.seqs == [a, high]  # the decode, then the admission
    assert s.running == [high, a] and list(s.waiting) == [b] and b.num_preemptions == 1


def test_a_better_arrival_preempts_worse_ones_until_its_blocks_are_free():
    # 6 blocks of 4 tokens, all held by three sequences of different priorities.
    s = make(num_blocks=6, block_size=4)
    top, low, lower = seq(8, 1), seq(8, 4, start=100), seq(8, 6, start=200)
    for q in (top, low, lower):
        s.add(q)
    run_step(s)
    assert s.blocks.num_free == 0
    high = seq(12, 2, start=300)  # needs 3 blocks: lower's 2 are not enough, low goes too
    s.add(high)
    batch = run_step(s)
    assert batch.preempted == [lower, low] and top in batch.seqs and high in batch.seqs
    assert s.running == [top, high] and list(s.waiting) == [low, lower]


def test_equal_or_better_running_sequences_never_give_way():
    s = make(max_num_seqs=1)
    first = seq(3, 1)
    s.add(first)
    run_step(s)
    same = seq(3, 1, start=10)  # same priority, arrived later: it waits
    s.add(same)
    batch = run_step(s)
    assert batch.seqs == [first] and not batch.preempted and list(s.waiting) == [same]


def test_a_decode_short_of_a_block_preempts_the_worst_ranked_not_the_newest():
    s = make(num_blocks=6, block_size=4)
    worst, b = seq(6, 9), seq(6, 1, start=100)  # 2 blocks each, room for 2 more tokens
    s.add(worst)
    s.add(b)
    run_step(s)
    best = seq(6, 0, start=200)  # the newest, and the best ranked
    s.add(best)
    run_step(s)  # its prompt takes the last 2 blocks
    assert s.running == [best, b, worst] and s.blocks.num_free == 0
    batch = run_step(s)
    while not batch.preempted:  # until a decode needs a third block: worst gives its 2 up
        batch = run_step(s)
    assert batch.preempted == [worst] and batch.seqs == [best, b]


def test_preempted_low_priority_work_resumes_with_its_outputs():
    s = make(max_num_seqs=1)
    low = seq(3, 5, max_new=4)
    s.add(low)
    run_step(s)
    run_step(s)
    assert low.output_ids == [1000, 1001]
    high = seq(3, 0, start=10, max_new=2)
    s.add(high)
    run_step(s)  # low gives way
    assert low.status.value == "waiting" and low.output_ids == [1000, 1001]
    while s.has_work():
        run_step(s)
    assert high.output_ids == [1000, 1001] and low.output_ids == [1000, 1001, 1002, 1003]


def tensors(priority: int) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array([[1, 2, 3]], np.int32),
        "request_output_len": np.array([[4]], np.int32),
        "priority": np.array([priority], np.int32),
    }


def test_the_engine_refuses_a_priority_under_fcfs_and_reads_it_under_priority():
    with pytest.raises(InvalidRequest, match=r"priority: only allowed with .*scheduling_policy priority"):
        parse_request(tensors(3), vocab_size=100, max_seq_len=64)
    assert parse_request(tensors(0), vocab_size=100, max_seq_len=64).priority == 0
    assert parse_request(tensors(-3), vocab_size=100, max_seq_len=64, by_priority=True).priority == -3


def test_scheduling_policy_setting():
    assert EngineConfig().scheduling_policy == "fcfs"
    config = EngineConfig.from_parameters({"scheduling_policy": "priority"}, env={})
    assert config.scheduling_policy == "priority"
    with pytest.raises(ConfigError, match="scheduling_policy: must be one of fcfs, priority"):
        EngineConfig(scheduling_policy="lifo")
