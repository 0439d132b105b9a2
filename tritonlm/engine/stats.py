"""The engine's counters since start-up, and the latencies the metrics thread drains.

Only the loop thread writes them; `Engine.stats` reads them from other threads (plain numbers, so a
read sees a recent value), and the metrics thread pops `latencies` (deque appends and pops are
thread-safe)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tritonlm.engine.block_manager import BlockManager
    from tritonlm.engine.scheduler import Scheduler
    from tritonlm.engine.sequence import TokenTiming
    from tritonlm.sampling.logits_processors import GrammarMask
    from tritonlm.sampling.sampler import SamplerOutput


class EngineStats:
    def __init__(self) -> None:
        self.steps = 0
        self.max_batch_size_seen = 0
        self.tokens_generated = 0
        self.spec_proposed = 0  # proposals verified (fed to the model) since start-up
        self.spec_accepted = 0  # of which accepted
        self.grammar_step_seconds = 0.0  # total time of the steps that applied a grammar mask
        # ("ttft" | "tpot", seconds) as they happen; bounded so nobody draining it costs no memory.
        self.latencies: deque[tuple[str, float]] = deque(maxlen=65536)

    def step(self, batch_size: int, sampled: SamplerOutput, seconds: float) -> None:
        """A step ran: `seconds` from the forward to the chosen tokens."""
        self.steps += 1
        self.max_batch_size_seen = max(self.max_batch_size_seen, batch_size)
        for made in sampled.tokens.values():
            self.spec_proposed += made.proposed
            self.spec_accepted += len(made.tokens) - 1
        if sampled.grammar_masked:
            self.grammar_step_seconds += seconds

    def generated(self, tokens: int) -> None:
        self.tokens_generated += tokens

    def first_token(self, seconds: float) -> None:
        """A request's time to first token, from its arrival."""
        self.latencies.append(("ttft", seconds))

    def finished(self, timings: list[TokenTiming]) -> None:
        """A request ended (not cancelled): the mean gap between its tokens after the first."""
        if len(timings) > 1:
            tpot = sum(t.decode_ms for t in timings[1:]) / (len(timings) - 1) / 1e3
            self.latencies.append(("tpot", tpot))

    def report(
        self, scheduler: Scheduler, blocks: BlockManager, grammar_mask: GrammarMask | None
    ) -> dict[str, float]:
        """Everything `Engine.stats` reports (serving.metrics publishes each key)."""
        kv = blocks.stats()
        return {
            "running": len(scheduler.running),
            "waiting": len(scheduler.waiting),
            "kv_blocks_total": kv.blocks_total,
            "kv_blocks_used": kv.blocks_used,
            "kv_blocks_free": kv.blocks_total - kv.blocks_used,
            "block_size": blocks.block_size,  # token positions per block (routers hash prompts by it)
            "prefix_caching": float(blocks.enable_prefix_caching),
            "prefix_cache_queries": kv.prefix_queries,  # prompt tokens looked up
            "prefix_cache_hits": kv.prefix_hits,  # of which cached
            "prefix_cache_hit_rate": kv.prefix_hits / kv.prefix_queries if kv.prefix_queries else 0.0,
            "preemptions": scheduler.num_preemptions,
            "steps": self.steps,
            "max_batch_size_seen": self.max_batch_size_seen,
            "tokens_generated": self.tokens_generated,
            # Structured output: steps with constrained rows, their time, and the masking's share.
            "grammar_steps": grammar_mask.steps if grammar_mask is not None else 0,
            "grammar_step_seconds": self.grammar_step_seconds,
            "grammar_mask_seconds": grammar_mask.seconds if grammar_mask is not None else 0.0,
            "spec_proposed_tokens": self.spec_proposed,
            "spec_accepted_tokens": self.spec_accepted,
            "spec_acceptance_rate": self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0,
        }


def adapter_sequences(scheduler: Scheduler) -> dict[tuple[str, str], int]:
    """(state, adapter name) -> the sequences running or waiting with that LoRA adapter ("running",
    "waiting"); adapters no sequence uses are left out. Read from other threads: the copies are one
    call each under the GIL, so the loop thread cannot change the queues while they are taken."""
    counts: dict[tuple[str, str], int] = {}
    for state, queue in (("running", list(scheduler.running)), ("waiting", list(scheduler.waiting))):
        for seq in queue:
            if seq.request.lora is not None:
                key = (state, seq.request.lora.name)
                counts[key] = counts.get(key, 0) + 1
    return counts
