"""The in-flight batching loop: schedule, forward, sample, retire.

One thread (`run`) owns the model, the KV cache and every admitted Sequence. Other threads only call
`add`, `stop` and `stats`; results leave through the `on_output` callback, called on the loop thread
with a sequence and the number of tokens it gained (0 when it finished without a new token).
Whoever receives the callback must not block (Triton's adapter hands it to a sender thread).

Each step: drop cancelled sequences → `Scheduler.schedule` (decodes, prefill chunks, admissions,
preemptions; see tritonlm.engine.scheduler) → one packed forward → sample the sequences whose chunk reached
their last token → append, check stop rules → retire finished ones (their blocks are freed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from tritonlm.engine.beam_group import BeamGroup
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler
from tritonlm.engine.sequence import Sequence, TokenTiming
from tritonlm.sampling.sampler import sample
from tritonlm.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)

OutputCallback = Callable[[Sequence, int], None]


class Engine:
    def __init__(self, runner: ModelRunner, on_output: OutputCallback, detokenizer_factory=None):
        self.runner = runner
        self.on_output = on_output
        self.detokenizer_factory = detokenizer_factory  # for stop strings; None: token matching only
        config = runner.config
        self.blocks = BlockManager(config.kv_cache_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.blocks, config.max_num_seqs, config.max_num_batched_tokens, config.max_queue_size
        )
        self.wakeup = threading.Condition()  # guards the scheduler's waiting queue
        self.stopped = False
        self.steps = 0
        self.max_batch_size_seen = 0
        self.tokens_generated = 0
        # ("ttft" | "tpot", seconds) as they happen, for the metrics thread to drain (deque appends
        # and pops are thread-safe); bounded so nobody draining it costs no memory.
        self.latencies: deque[tuple[str, float]] = deque(maxlen=65536)

    # -- called from other threads ------------------------------------------------------------
    def add(self, seq: Sequence) -> bool:
        """Queues a request; False when the waiting queue is full (the caller refuses it)."""
        seq.generator = seq.params.make_generator(self.runner.device)
        if seq.beam_width > 1:
            seq.group = BeamGroup(seq, self.runner.config.max_seq_len)
        if seq.stop_strings and self.detokenizer_factory is not None:
            seq.detokenizer = self.detokenizer_factory()
        with self.wakeup:
            if not self.scheduler.add(seq):
                return False
            self.wakeup.notify()
        return True

    def stop(self) -> None:
        with self.wakeup:
            self.stopped = True
            self.wakeup.notify()

    def stats(self) -> dict[str, float]:
        blocks = self.blocks.stats()
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_blocks_total": blocks.blocks_total,
            "kv_blocks_used": blocks.blocks_used,
            "kv_blocks_free": blocks.blocks_total - blocks.blocks_used,
            "prefix_cache_queries": blocks.prefix_queries,  # prompt tokens looked up
            "prefix_cache_hits": blocks.prefix_hits,  # of which cached
            "prefix_cache_hit_rate": blocks.prefix_hits / blocks.prefix_queries
            if blocks.prefix_queries
            else 0.0,
            "preemptions": self.scheduler.num_preemptions,
            "steps": self.steps,
            "max_batch_size_seen": self.max_batch_size_seen,
            "tokens_generated": self.tokens_generated,
        }

    # -- the loop thread ----------------------------------------------------------------------
    def run(self) -> None:
        while True:
            with self.wakeup:
                while not self.stopped and not self.scheduler.has_work():
                    self.wakeup.wait()
                if self.stopped:
                    break
            try:
                self.step()
            except Exception as error:  # a failing step must not kill the loop: fail its requests
                log.exception("engine step failed; failing the running requests")
                self._fail_running(f"engine step failed: {error!r}")

    def _fail_running(self, message: str) -> None:
        for seq in list(self.scheduler.running):
            if seq.group is not None and seq.group.request is not seq:
                continue  # a beam: its request answers for the group
            self._finish(seq)
            if not seq.finish_reason:  # some may have finished before the failure
                seq.error = message
                self._retire(seq, "error")
        # Blocks registered for the failed step may hold garbage: forget every cached prefix.
        self.blocks.reset_prefix_cache()
        self.blocks.take_pending_copies()
        self.runner.reset()

    def _retire(self, seq: Sequence, reason: str, new_tokens: int = 0) -> None:
        """Reports a finished sequence; the caller already took it out of the scheduler."""
        seq.finish_reason = reason
        if len(seq.timings) > 1 and reason != "cancelled":
            tpot = sum(t.decode_ms for t in seq.timings[1:]) / (len(seq.timings) - 1) / 1e3
            self.latencies.append(("tpot", tpot))
        self.on_output(seq, new_tokens)

    def _finish(self, seq: Sequence) -> None:
        """Takes a request out of the scheduler: a beam-search request with all its beams."""
        if seq.group is not None:
            seq.group.finish(self.scheduler)
        self.scheduler.finish(seq)

    def _drop_cancelled(self) -> None:
        for queue in (self.scheduler.running, self.scheduler.waiting):
            for seq in [s for s in queue if s.is_cancelled()]:
                if seq.finish_reason:  # a beam whose request was retired a moment ago
                    continue
                request = seq.group.request if seq.group is not None else seq
                self._finish(request)
                self._retire(request, "cancelled")

    def step(self) -> None:
        with self.wakeup:
            self._drop_cancelled()
            batch = self.scheduler.schedule()
        if not batch:  # nothing could run (only while blocks are being freed); do not spin
            with self.wakeup:
                self._unblock_beams()
            time.sleep(0.001)
            return
        start = time.perf_counter()
        flags = batch.sample
        keep_all = [s.needs_prompt_logits and s.num_computed < len(s.prompt_ids) for s in batch.seqs]
        out = self.runner.forward(
            batch.seqs, batch.num_new, flags, keep_all, copies=self.blocks.take_pending_copies()
        )
        for i, logits in out.all_logits.items():
            self._keep_prompt_logits(batch.seqs[i], logits)
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            seq.num_computed += n
        sampled = [s for s, flag in zip(batch.seqs, flags, strict=True) if flag]
        plain = [i for i, s in enumerate(sampled) if s.group is None]
        logits = out.logits[plain] if len(plain) < len(sampled) else out.logits
        inputs = [sampled[i].sampler_input() for i in plain]
        tokens, log_probs = sample(logits, inputs) if plain else ([], None)
        end = time.perf_counter()

        self.steps += 1
        self.max_batch_size_seen = max(self.max_batch_size_seen, len(batch))
        self.tokens_generated += len(sampled)
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            if not seq.output_ids and n:
                seq.prefill_ms += (end - start) * 1e3  # every step that fed its prompt
        for j, i in enumerate(plain):
            self._append(sampled[i], tokens[j], log_probs, j, logits, len(batch), start, end)
        for i, seq in enumerate(sampled):
            if seq.group is not None and seq.group.report(seq, out.logits[i]):
                self._advance_beams(seq.group, len(batch), start, end)

    def _unblock_beams(self) -> None:
        """Every running place may be held by beams waiting for their groups' other beams, which
        wait for a place: preempt the newest (it is recomputed later) so the queue moves."""
        running = self.scheduler.running
        if self.scheduler.waiting and running and all(s.num_computed == s.num_tokens for s in running):
            self.scheduler.preempt(running[-1])

    def _advance_beams(self, group: BeamGroup, batch_size: int, start: float, end: float) -> None:
        if not group.request.output_ids and not group.request.timings:
            self.latencies.append(("ttft", end - group.request.arrival))
        self.tokens_generated += len(group.beams)
        if group.advance(self.scheduler, batch_size, start, end):
            reasons = group.finish_reasons()
            self._retire(group.request, reasons[0] if reasons else "length")

    def _append(
        self,
        seq: Sequence,
        token: int,
        log_probs: object,
        row: int,
        logits: torch.Tensor,
        batch_size: int,
        start: float,
        end: float,
    ) -> None:
        if not seq.output_ids:
            self.latencies.append(("ttft", end - seq.arrival))
        seq.timings.append(
            TokenTiming(batch_size, int((start - seq.last_event) * 1e6), (end - seq.last_event) * 1e3)
        )
        seq.last_event = end
        seq.output_ids.append(token)
        if seq.params.return_generation_logits:
            seq.generation_logits.append(logits[row].float().cpu())
        if log_probs is not None and seq.params.return_log_probs:
            seq.log_probs.append(log_probs[row])
            if seq.params.num_top_log_probs:
                seq.top_ids.append(log_probs.top_ids[row])
                seq.top_log_probs.append(log_probs.top_values[row])
        new_text = seq.detokenizer.add([token]) if seq.detokenizer is not None else ""
        reason = seq.check_stop(new_text, self.runner.config.max_seq_len)
        if reason:
            self.scheduler.finish(seq)
            self._retire(seq, reason, new_tokens=1)
        else:
            self.on_output(seq, 1)

    def _keep_prompt_logits(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Keeps the logits of the prompt positions of this chunk not kept yet (a recompute after a
        preemption feeds them again)."""
        have = sum(t.shape[0] for t in seq.prompt_logits)
        first = seq.num_computed  # the chunk's first position (num_computed not advanced yet)
        rows = logits[max(have - first, 0) : len(seq.prompt_ids) - first]
        if rows.shape[0]:
            seq.prompt_logits.append(rows.float().cpu())
