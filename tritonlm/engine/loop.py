"""The in-flight batching loop. One thread (`run`) owns the model, the KV cache and every admitted
Sequence; other threads only call `add`, `stop` and `stats`. Each step, after dropping cancelled
sequences, is four stages:

1. schedule (engine.scheduler): `Scheduler.schedule() -> SchedulerOutput`: which sequences feed how
   many tokens (decodes with their proposals, prefill chunks, admissions), preempting the newest
   when blocks run out;
2. execute (a `step.Worker`, e.g. worker.model_runner): `execute(StepBatch) -> ModelOutput`: one
   packed forward of the step's plain data (`engine.step_data`), the logits rows each sampled
   sequence needs (and all rows of prompts whose logits are kept);
3. sample (sampling.sampler): `Sampler(logits, SamplingMetadata) -> SamplerOutput` (the metadata
   made from the step's plain `StepSamples`): logits processors (the grammar mask among them),
   temperature, the chosen tokens or the verified proposals, their log probs and alternatives, and
   prompt log probs;
4. process outputs (engine.output_processor): `OutputProcessor.update(SchedulerOutput,
   SamplerOutput)`: append tokens with their timings, log probs and text, stop rules, rollback of
   rejected proposals, beam groups, finished sequences retired; results leave through the
   `on_output` callback.

Proposals for speculative decoding (spec_decode) are made before scheduling; requests with a
grammar wait in structured_output's holder until it is compiled; counters live in `EngineStats`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tritonlm.engine.beam_group import BeamGroup, BeamRoom
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.output_processor import OutputCallback, OutputProcessor, request_of
from tritonlm.engine.request import Request, recurrent_refusal
from tritonlm.engine.scheduler import Scheduler
from tritonlm.engine.sequence import Sequence, Status
from tritonlm.engine.speculator import Speculator
from tritonlm.engine.stats import EngineStats, adapter_sequences
from tritonlm.engine.step_data import step_batch, step_samples
from tritonlm.errors import overloaded_message
from tritonlm.sampling.logits_processors import default_pipeline
from tritonlm.sampling.metadata import SamplingMetadata
from tritonlm.sampling.sampler import Sampler
from tritonlm.step import Worker
from tritonlm.structured_output import GrammarHolder

log = logging.getLogger(__name__)

__all__ = ["Engine", "OutputCallback"]


class Engine:
    def __init__(self, runner: Worker, on_output: OutputCallback, tokenizer: object | None = None):
        self.runner = runner
        self.tokenizer = tokenizer  # for text (stop strings, text outputs); None: token ids only
        config = runner.config
        self.blocks = BlockManager(
            config.kv_cache_blocks,
            config.block_size,
            config.enable_prefix_caching is not False,  # None: unresolved, the default (on)
            window=runner.kv_window,
            state_slots=runner.state_slots,
        )
        self.scheduler = Scheduler(
            self.blocks,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.max_queue_size,
            policy=config.scheduling_policy,
        )
        self.beam_room = BeamRoom(
            config.max_num_seqs, config.kv_cache_blocks, config.block_size, runner.kv_window
        )
        self.sampler = Sampler(default_pipeline(config))
        self.counters = EngineStats()
        # Speculative decoding inside the server (off unless `speculative_model` is set).
        self.speculator = Speculator.from_config(config, runner.vocab_size, runner.device, runner.dtype)
        self.outputs = OutputProcessor(
            self.scheduler,
            self.blocks,
            self.sampler,
            self.counters,
            on_output,
            config.max_seq_len,
            self.speculator,
        )
        # Structured output: guided requests wait there while their grammar compiles.
        self.grammars: GrammarHolder[Sequence] = GrammarHolder(
            tokenizer, runner.vocab_size, self._join, self.outputs.fail
        )
        self.wakeup = threading.Condition()  # guards the scheduler's waiting queue
        self.stopped = False

    # -- called from other threads ------------------------------------------------------------
    def add(self, request: Request, is_cancelled: Callable[[], bool] | None = None) -> Sequence | None:
        """Queues a request and returns its sequence; None when the waiting queue is full (the
        caller refuses it). A guided request joins the queue once its grammar is compiled (at once
        when cached), others go on meanwhile; it fails alone if the guide is bad. A request its
        model cannot serve exactly (`recurrent_refusal`) is a ValueError (serving refuses it first)."""
        if self.runner.state_slots and (why := recurrent_refusal(request.draft is not None)):
            raise ValueError(why)
        room = request.new_token_room(self.runner.config.max_seq_len)
        if why := self.beam_room.refusal(request.beam_width, len(request.prompt_ids), room):
            raise ValueError(why)
        guide = request.guide
        seq = Sequence.start(
            request,
            max_seq_len=self.runner.config.max_seq_len,
            tokenizer=self.tokenizer,
            grammar=self.grammars.grammar(guide, request.params) if guide is not None else None,
            is_cancelled=is_cancelled,
        )
        if seq.grammar is not None:
            self.grammars.hold(seq, seq.grammar)
            return seq
        return seq if self._enqueue(seq) else None

    def add_all(
        self, requests: tuple[Request, ...], is_cancelled: Callable[[], bool] | None = None
    ) -> list[Sequence] | None:
        """Queues the sequences a request runs (its `Request.sequences`: several with
        num_return_sequences and sampling), all of them or, when the waiting queue has no room for
        them all, none (None). Only the caller's thread adds, so the room it finds stays."""
        with self.wakeup:
            if not self.scheduler.has_room(len(requests)):
                return None
        seqs = [self.add(r, is_cancelled) for r in requests]
        return None if None in seqs else seqs  # type: ignore[return-value]

    def _enqueue(self, seq: Sequence) -> bool:
        runs = seq
        if seq.request.beam_width > 1:  # the request waits for its beams, which the scheduler runs
            seq.group = BeamGroup(seq, self.runner.config.max_seq_len)
            runs = seq.group.beams[0]
        with self.wakeup:
            if not self.scheduler.add(runs):
                return False
            if runs is not seq:
                seq.status = Status.AWAITING_BEAMS
            self.wakeup.notify()
        return True

    def _join(self, seq: Sequence) -> str:
        """Queues a sequence whose grammar is compiled: "" or why not (GrammarHolder's `join`)."""
        return "" if self._enqueue(seq) else overloaded_message(len(self.scheduler.waiting))

    def stop(self) -> None:
        with self.wakeup:
            self.stopped = True
            self.wakeup.notify()
        self.grammars.close()

    def stats(self) -> dict[str, float]:
        return self.counters.report(self.scheduler, self.blocks, self.sampler.grammar_mask)

    def adapter_sequences(self) -> dict[tuple[str, str], int]:
        """(running | waiting, LoRA adapter name) -> sequences: what routers read for adapter affinity."""
        return adapter_sequences(self.scheduler)

    @property
    def steps(self) -> int:
        return self.counters.steps

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

    def step(self) -> None:
        if self.speculator is not None:  # outside the lock: only this thread changes `running`
            self.speculator.propose(self.scheduler.running)
        with self.wakeup:
            self.outputs.drop_cancelled()
            batch = self.scheduler.schedule()
        if not batch:  # nothing could run (only while blocks are being freed); do not spin
            with self.wakeup:
                self.scheduler.unblock_beams()
            time.sleep(0.001)
            return
        start = time.perf_counter()
        step = step_batch(batch)
        out = self.runner.execute(step)
        sampled = self.sampler(
            out.logits, SamplingMetadata.of_step(step_samples(batch, step), out.all_logits)
        )
        end = time.perf_counter()
        self.counters.step(len(batch), sampled, end - start)
        self.outputs.update(batch, sampled, start, end)

    def _fail_running(self, message: str) -> None:
        for seq in list(self.scheduler.running):
            request = request_of(seq)
            if request.finished:  # an earlier beam of its group failed it already
                continue
            self.outputs.finish(request)
            self.outputs.fail(request, message)
        # Blocks registered for the failed step may hold garbage: forget every cached prefix.
        self.blocks.reset_prefix_cache()
        self.blocks.take_pending_copies()
        self.blocks.take_pending_state_copies()
        self.runner.reset()
