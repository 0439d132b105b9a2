"""OutputProcessor and EngineStats without a model: a real scheduler and block manager, the
sampler's output written by hand."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import sequence

from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.output_processor import OutputProcessor
from tritonlm.engine.scheduler import Scheduler, fit_proposals
from tritonlm.engine.stats import EngineStats, adapter_sequences
from tritonlm.lora.adapter import LoraAdapter
from tritonlm.sampling.logits_processors import default_pipeline
from tritonlm.sampling.params import SamplingParams
from tritonlm.sampling.sampler import PromptLogProbs, SampledTokens, Sampler, SamplerOutput


def setup(max_seq_len: int = 64):
    scheduler = Scheduler(BlockManager(32, 4), 8, 64)
    reports: list[tuple[object, int, str]] = []
    stats = EngineStats()
    outputs = OutputProcessor(
        scheduler,
        scheduler.blocks,
        Sampler(default_pipeline()),
        stats,
        lambda seq, n: reports.append((seq, n, seq.out.finish_reason)),
        max_seq_len,
    )
    return scheduler, outputs, stats, reports


def test_tokens_timings_and_log_probs_are_appended_and_reported_once_per_step():
    scheduler, outputs, stats, reports = setup()
    seq = sequence([1, 2, 3], 4, SamplingParams(return_log_probs=True))
    scheduler.add(seq)
    batch = scheduler.schedule()
    sampled = SamplerOutput(tokens={0: SampledTokens([9], log_probs=[-0.5])})
    seq.last_event = 100.0  # its arrival
    outputs.update(batch, sampled, start=101.0, end=101.25)
    assert seq.num_computed == 3 and seq.output_ids == [9] and seq.out.log_probs == [-0.5]
    timing = seq.out.timings[0]
    assert timing.batch_size == 1 and timing.queue_wait_us == 1_000_000 and timing.decode_ms == 1250.0
    assert seq.out.prefill_ms == 250.0 and reports == [(seq, 1, "")]
    assert stats.tokens_generated == 1 and [k for k, _ in stats.latencies] == ["ttft"]


def test_a_stop_ends_the_run_drops_later_tokens_and_frees_the_blocks():
    scheduler, outputs, stats, reports = setup()
    seq = sequence([1, 2, 3], 10, SamplingParams(end_id=5))
    scheduler.add(seq)
    outputs.update(scheduler.schedule(), SamplerOutput(tokens={0: SampledTokens([4])}), 0.0, 0.1)
    seq.spec_tokens = [5, 6]  # proposals fed with its pending token: all accepted, then the next
    batch = scheduler.schedule()
    assert batch.num_new == [3]
    outputs.update(batch, SamplerOutput(tokens={0: SampledTokens([5, 6, 7], proposed=2)}), 0.2, 0.3)
    assert seq.output_ids == [4, 5] and seq.out.finish_reason == "end_id"
    assert reports[-1] == (seq, 1, "end_id") and len(seq.out.timings) == 2
    assert not scheduler.has_work() and scheduler.blocks.stats().blocks_used == 0
    assert [k for k, _ in stats.latencies] == ["ttft", "tpot"] and stats.tokens_generated == 2


def test_rejected_proposals_give_their_slots_back():
    scheduler, outputs, _, reports = setup()
    seq = sequence([1, 2, 3], 10, SamplingParams())
    scheduler.add(seq)
    outputs.update(scheduler.schedule(), SamplerOutput(tokens={0: SampledTokens([4])}), 0.0, 0.1)
    seq.spec_tokens = [5, 6, 7]
    batch = scheduler.schedule()
    assert seq.num_computed == 3 and len(seq.block_table) == 2  # 3 + 4 slots
    outputs.update(batch, SamplerOutput(tokens={0: SampledTokens([5, 8], proposed=3)}), 0.2, 0.3)
    # Fed 4 (pending 4, proposals 5 6 7): 4 and 5 stay computed, 6 and 7 are rolled back.
    assert seq.output_ids == [4, 5, 8] and seq.num_computed == 5 and not seq.spec_tokens
    assert len(seq.block_table) == 2 and reports[-1] == (seq, 2, "")
    # Since the previous token's step ended; the second token arrived with the first.
    assert [t.decode_ms for t in seq.out.timings][1:] == [pytest.approx(200.0), 0.0]


def test_prompt_chunks_are_kept_and_cancelled_requests_retire():
    scheduler, outputs, stats, reports = setup()
    params = SamplingParams(return_context_logits=True, return_prompt_log_probs=True)
    seq = sequence([1, 2, 3], 10, params)
    scheduler.add(seq)
    batch = scheduler.schedule()
    chunk = PromptLogProbs(0, 3, torch.zeros(3, 8), [-1.0, -2.0], [[1], [2]], [[-0.1], [-0.2]])
    outputs.update(batch, SamplerOutput(tokens={0: SampledTokens([4])}, prompts={0: chunk}), 0.0, 0.1)
    out = seq.out
    assert out.prompt_positions == 3 and out.prompt_log_probs == [-1.0, -2.0] and len(out.prompt_logits) == 1
    assert out.prompt_top_ids == [[1], [2]] and out.prompt_top_log_probs == [[-0.1], [-0.2]]
    seq.is_cancelled = lambda: True
    outputs.drop_cancelled()
    assert out.finish_reason == "cancelled" and reports[-1] == (seq, 0, "cancelled")
    assert not scheduler.has_work() and [k for k, _ in stats.latencies] == ["ttft"]  # no tpot


def test_fail_reports_an_error():
    _, outputs, _, reports = setup()
    seq = sequence([1], 4)
    outputs.fail(seq, "bad guide")
    assert seq.finished and seq.out.error == "bad guide" and reports == [(seq, 0, "error")]


def test_engine_stats_count_steps_proposals_and_grammar_time():
    stats = EngineStats()
    sampled = SamplerOutput(tokens={0: SampledTokens([1, 2], proposed=3), 1: SampledTokens([5])})
    stats.step(2, sampled, 0.5)
    stats.step(5, SamplerOutput(grammar_masked=True), 0.25)
    assert (stats.steps, stats.max_batch_size_seen) == (2, 5)
    assert (stats.spec_proposed, stats.spec_accepted) == (3, 1) and stats.grammar_step_seconds == 0.25
    scheduler = Scheduler(BlockManager(8, 4), 2, 16)
    report = stats.report(scheduler, scheduler.blocks, None)
    assert report["spec_acceptance_rate"] == 1 / 3 and report["steps"] == 2 and report["grammar_steps"] == 0
    assert report["kv_blocks_free"] == 8 and report["running"] == report["waiting"] == 0


def test_stats_report_the_block_size_and_the_sequences_each_lora_adapter_has_running_and_waiting():
    scheduler = Scheduler(BlockManager(8, 4), 2, 16)  # two sequences run at most
    alpha, beta = (LoraAdapter(name, {}, 0) for name in ("alpha", "task 7"))
    for adapter in (alpha, alpha, beta, None, beta):
        scheduler.add(sequence([1, 2], 4, lora=adapter))
    assert adapter_sequences(scheduler) == {("waiting", "alpha"): 2, ("waiting", "task 7"): 2}
    scheduler.schedule()  # the first two run
    assert adapter_sequences(scheduler) == {("running", "alpha"): 2, ("waiting", "task 7"): 2}
    report = EngineStats().report(scheduler, scheduler.blocks, None)
    assert report["block_size"] == 4 and report["prefix_caching"] == 1.0
    assert (report["running"], report["waiting"]) == (2, 3)


def test_fit_proposals_takes_all_or_none():
    seq = sequence([1, 2], 8)
    seq.spec_tokens = [3, 4, 5]
    assert fit_proposals(seq, 2, budget=5, room=lambda total: True) == 5 and seq.spec_tokens == [3, 4, 5]
    assert fit_proposals(seq, 2, budget=4, room=lambda total: True) == 2 and not seq.spec_tokens  # budget
    seq.spec_tokens = [3, 4, 5]
    asked = []
    assert fit_proposals(seq, 1, budget=9, room=lambda total: asked.append(total) or False) == 1
    assert asked == [4] and not seq.spec_tokens  # the free blocks
    assert fit_proposals(seq, 1, budget=9, room=lambda total: False) == 1  # no proposals: n as is
