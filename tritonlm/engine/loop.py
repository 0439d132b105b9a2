"""The in-flight batching loop: schedule, forward, sample, retire.

One thread (`run`) owns the model, the KV cache and every admitted Sequence. Other threads only call
`add`, `stop` and `stats`; results leave through the `on_output` callback, called on the loop thread
with a sequence and the number of tokens it gained (0 when it finished without a new token).
Whoever receives the callback must not block (Triton's adapter hands it to a sender thread).

Each step: drop cancelled sequences → `Scheduler.schedule` (decodes, prefill chunks, admissions,
preemptions; see engine.scheduler) → one packed forward → sample the sequences whose chunk reached
their last token → append, check stop rules (engine.stopping) → retire finished ones (their blocks
are freed). A beam-search request's beams report their logits to their group (engine.beam_group),
which advances them all at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tritonlm.engine.beam_group import BeamGroup
from tritonlm.engine.block_manager import BlockManager
from tritonlm.engine.scheduler import Scheduler, SchedulerOutput
from tritonlm.engine.sequence import Sequence, Status, TokenTiming
from tritonlm.engine.stopping import finish_reason, text_stream
from tritonlm.errors import CLIENT_ERROR_MARKER, overloaded_message
from tritonlm.sampling.logits_processors import GrammarMask, default_pipeline
from tritonlm.sampling.sampler import LogProbs, SamplerInput, choose, log_probs_of, process
from tritonlm.spec_decode.acceptance import verify
from tritonlm.spec_decode.speculator import Speculator
from tritonlm.structured_output import Grammars, GrammarState
from tritonlm.worker.model_runner import ModelOutput, ModelRunner

log = logging.getLogger(__name__)

OutputCallback = Callable[[Sequence, int], None]


@dataclass
class TokenPicks:
    """Where a sequence's tokens of one step came from: `rows[j]` is token j's row in the step's
    raw logits `raw` and in the processed `log_probs`; `inputs` are those rows' sampler inputs."""

    rows: list[int]
    raw: torch.Tensor
    log_probs: torch.Tensor | None
    inputs: list[SamplerInput]

    def log_probs_of(self, tokens: list[int]) -> LogProbs | None:
        if self.log_probs is None:
            return None
        rows = self.rows[: len(tokens)]
        return log_probs_of(self.log_probs, rows, tokens, [self.inputs[r] for r in rows])


class Engine:
    def __init__(self, runner: ModelRunner, on_output: OutputCallback, tokenizer: object | None = None):
        self.runner = runner
        self.on_output = on_output
        self.tokenizer = tokenizer  # for text (stop strings, text outputs); None: token ids only
        config = runner.config
        self.blocks = BlockManager(config.kv_cache_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.blocks, config.max_num_seqs, config.max_num_batched_tokens, config.max_queue_size
        )
        self.logits_processors = default_pipeline(config)
        # Structured output: compiles guides off this loop (needs the tokenizer's vocabulary).
        self.grammars = Grammars(tokenizer, runner.vocab_size) if tokenizer is not None else None
        self.grammar_mask = next(p for p in self.logits_processors.processors if isinstance(p, GrammarMask))
        self.grammar_step_seconds = 0.0  # total time of the steps that applied a grammar mask
        # Speculative decoding inside the server (off unless `speculative_model` is set).
        self.speculator = Speculator.from_config(config, runner.vocab_size, runner.device, runner.dtype)
        self.wakeup = threading.Condition()  # guards the scheduler's waiting queue
        self.stopped = False
        self.steps = 0
        self.max_batch_size_seen = 0
        self.tokens_generated = 0
        self.spec_proposed = 0  # proposals verified (fed to the model) since start-up
        self.spec_accepted = 0  # of which accepted
        # ("ttft" | "tpot", seconds) as they happen, for the metrics thread to drain (deque appends
        # and pops are thread-safe); bounded so nobody draining it costs no memory.
        self.latencies: deque[tuple[str, float]] = deque(maxlen=65536)

    # -- called from other threads ------------------------------------------------------------
    def add(self, seq: Sequence) -> bool:
        """Queues a request; False when the waiting queue is full (the caller refuses it)."""
        request = seq.request
        seq.generator = request.params.make_generator(self.runner.device)
        seq.text = text_stream(request, self.tokenizer)
        if request.draft is not None:  # verified with the prompt's last chunk; never past the limits
            room = min(request.max_new_tokens, self.runner.config.max_seq_len - seq.num_tokens) - 1
            seq.spec_tokens = list(request.draft.ids[: max(room, 0)])
        if request.guide is not None:
            # It joins the queue once compiled (now, when cached); others go on meanwhile.
            seq.grammar = self._grammar(seq)
            seq.grammar.compiled.add_done_callback(lambda _: self._compiled(seq))
            return True
        return self._enqueue(seq)

    def _grammar(self, seq: Sequence) -> GrammarState:
        if self.grammars is None:
            raise RuntimeError("structured output needs the engine's tokenizer")
        guide, params = seq.request.guide, seq.params
        stop_ids = ([params.end_id] if params.end_id >= 0 else []) + params.stop_token_ids
        return GrammarState(self.grammars.compile(guide.type, guide.text), stop_ids)

    def _compiled(self, seq: Sequence) -> None:
        """When its grammar is compiled (on the compiling thread, or in `add` when it was cached):
        queue the sequence, or fail it alone (a bad guide is the client's mistake: the error names
        the guide tensor; a full queue refuses it)."""
        error = seq.grammar.compiled.exception()
        if error is None and self._enqueue(seq):
            return
        seq.status = Status.FINISHED
        seq.out.error = str(error) if error is not None else overloaded_message(len(self.scheduler.waiting))
        self._retire(seq, "error")

    def _enqueue(self, seq: Sequence) -> bool:
        request = seq.request
        runs = seq
        if request.beam_width > 1:  # the request waits for its beams, which the scheduler runs
            seq.group = BeamGroup(seq, self.runner.config.max_seq_len)
            runs = seq.group.beams[0]
        with self.wakeup:
            if not self.scheduler.add(runs):
                return False
            if runs is not seq:
                seq.status = Status.AWAITING_BEAMS
            self.wakeup.notify()
        return True

    def stop(self) -> None:
        with self.wakeup:
            self.stopped = True
            self.wakeup.notify()
        if self.grammars is not None:
            self.grammars.close()

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
            # Structured output: steps with constrained rows, their time, and the masking's share.
            "grammar_steps": self.grammar_mask.steps,
            "grammar_step_seconds": self.grammar_step_seconds,
            "grammar_mask_seconds": self.grammar_mask.seconds,
            "spec_proposed_tokens": self.spec_proposed,
            "spec_accepted_tokens": self.spec_accepted,
            "spec_acceptance_rate": self.spec_accepted / self.spec_proposed if self.spec_proposed else 0.0,
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
            request = self._request_of(seq)
            if request.finished:  # an earlier beam of its group failed it already
                continue
            self._finish(request)
            request.out.error = message
            self._retire(request, "error")
        # Blocks registered for the failed step may hold garbage: forget every cached prefix.
        self.blocks.reset_prefix_cache()
        self.blocks.take_pending_copies()
        self.runner.reset()

    def _retire(self, seq: Sequence, reason: str, new_tokens: int = 0) -> None:
        """Reports a finished sequence; the caller already took it out of the scheduler."""
        if seq.text is not None:
            seq.out.text_end = seq.text.finish()
        if self.speculator is not None:
            self.speculator.forget(seq)
        seq.out.finish_reason = reason
        timings = seq.out.timings
        if len(timings) > 1 and reason != "cancelled":
            tpot = sum(t.decode_ms for t in timings[1:]) / (len(timings) - 1) / 1e3
            self.latencies.append(("tpot", tpot))
        self.on_output(seq, new_tokens)

    def _finish(self, seq: Sequence) -> None:
        """Takes a request out of the scheduler: a beam-search request with all its beams."""
        if seq.group is not None:
            seq.group.finish(self.scheduler)
            seq.status = Status.FINISHED
        else:
            self.scheduler.finish(seq)

    @staticmethod
    def _request_of(seq: Sequence) -> Sequence:
        """The sequence a client's responses come from: a beam's group head, else itself."""
        return seq.group.head if seq.group is not None else seq

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.scheduler.sequences() if s.is_cancelled()]:
            request = self._request_of(seq)
            if not request.finished:  # another beam of its group may have retired it already
                self._finish(request)
                self._retire(request, "cancelled")

    def step(self) -> None:
        if self.speculator is not None:  # outside the lock: only this thread changes `running`
            self.speculator.propose(self.scheduler.running)
        with self.wakeup:
            self._drop_cancelled()
            batch = self.scheduler.schedule()
        if not batch:  # nothing could run (only while blocks are being freed); do not spin
            with self.wakeup:
                self._unblock_beams()
            time.sleep(0.001)
            return
        start = time.perf_counter()
        rows = batch.num_logits  # 1 + proposals fed for a sampled sequence, 0 for others
        out = self.runner.execute(batch)
        for i, logits in out.all_logits.items():
            self._keep_prompt_logits(batch.seqs[i], logits)
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            seq.num_computed += n
        plain = [i for i, m in enumerate(rows) if m and batch.seqs[i].group is None]
        masked = self.grammar_mask.steps
        made = self._choose(batch, out, rows, plain)
        end = time.perf_counter()
        if self.grammar_mask.steps != masked:
            self.grammar_step_seconds += end - start

        self.steps += 1
        self.max_batch_size_seen = max(self.max_batch_size_seen, len(batch))
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            if not seq.output_ids and n:
                seq.out.prefill_ms += (end - start) * 1e3  # every step that fed its prompt
        for i, (tokens, picks) in zip(plain, made, strict=True):
            self._append(batch.seqs[i], tokens, picks, rows[i] - 1, len(batch), start, end)
        for i, seq in enumerate(batch.seqs):
            if rows[i] and seq.group is not None and seq.group.report(seq, out.logits_of(i)[-1]):
                self._advance_beams(seq.group, len(batch), start, end)

    @torch.inference_mode()
    def _choose(
        self, batch: SchedulerOutput, out: ModelOutput, rows: list[int], plain: list[int]
    ) -> list[tuple[list[int], TokenPicks]]:
        """The tokens each sampled sequence (batch indices `plain`) makes this step: one drawn from
        its row, or, after proposals, those verification keeps (spec_decode.acceptance). Every row
        is processed with the prefix it sees (output + the proposals before it)."""
        if not plain:
            return []
        inputs: list[SamplerInput] = []
        owners: list[tuple[int, int]] = []  # per sequence: its first row among `inputs`, its rows
        for i in plain:
            seq = batch.seqs[i]
            owners.append((len(inputs), rows[i]))
            proposals = seq.spec_tokens[: rows[i] - 1]
            inputs += [seq.sampler_input(proposals[:j]) for j in range(rows[i])]
        raw = (
            out.logits if len(inputs) == out.logits.shape[0] else torch.cat([out.logits_of(i) for i in plain])
        )
        logits, log_probs = process(raw, inputs, self.logits_processors)
        singles = [first for first, m in owners if m == 1]
        drawn = dict(zip(singles, choose(logits[singles], [inputs[r] for r in singles]), strict=True))
        made: list[tuple[list[int], TokenPicks]] = []
        for i, (first, m) in zip(plain, owners, strict=True):
            if m == 1:
                tokens = [drawn[first]]
            else:
                seq = batch.seqs[i]
                draft = seq.request.draft if not seq.output_ids else None  # a client's drafts: step 1
                tokens = verify(
                    logits[first : first + m],
                    inputs[first : first + m],
                    seq.spec_tokens[: m - 1],
                    draft.probs[: m - 1] if draft is not None and draft.probs is not None else None,
                    draft.threshold if draft is not None else None,
                )
                self.spec_proposed += m - 1
                self.spec_accepted += len(tokens) - 1
            picks = list(range(first, first + len(tokens)))
            made.append((tokens, TokenPicks(picks, raw, log_probs, inputs)))
        return made

    def _unblock_beams(self) -> None:
        """Every running place may be held by beams waiting for their groups' other beams, which
        wait for a place: preempt the newest (it is recomputed later) so the queue moves."""
        running = self.scheduler.running
        if self.scheduler.waiting and running and all(s.status is Status.AWAITING_BEAMS for s in running):
            self.scheduler.preempt(running[-1])

    def _advance_beams(self, group: BeamGroup, batch_size: int, start: float, end: float) -> None:
        head = group.head
        if not head.out.timings:
            self.latencies.append(("ttft", end - head.request.arrival))
        self.tokens_generated += len(group.beams)
        if group.advance(self.scheduler, self.logits_processors, batch_size, start, end):
            reasons = group.finish_reasons()
            head.status = Status.FINISHED
            self._retire(head, reasons[0] if reasons else "length")

    def _append(
        self,
        seq: Sequence,
        tokens: list[int],
        picks: TokenPicks,
        proposed: int,
        batch_size: int,
        start: float,
        end: float,
    ) -> None:
        """Appends a step's tokens one by one, each checked against the stop rules (a stop ends
        the run: later tokens are dropped), settles the proposals the step fed (`proposed`), and
        reports the run once: one response per accepted run of tokens. Timings stay per token:
        the first carries the wait and the step's time, the others arrived with it."""
        out = seq.out
        if not seq.output_ids:
            self.latencies.append(("ttft", end - seq.request.arrival))
        log_probs = picks.log_probs_of(tokens) if seq.params.return_log_probs else None
        reason = ""
        for j, token in enumerate(tokens):
            first = j == 0
            out.timings.append(
                TokenTiming(
                    batch_size,
                    int((start - seq.last_event) * 1e6) if first else 0,
                    (end - seq.last_event) * 1e3 if first else 0.0,
                )
            )
            seq.output_ids.append(token)
            self.tokens_generated += 1
            if seq.grammar is not None and not seq.grammar.sync(seq.output_ids):
                # Only when other rules banned every token the grammar allows (min_length, bad_words).
                self.scheduler.finish(seq)
                out.error = (
                    f"{CLIENT_ERROR_MARKER} guided_decoding_guide: the grammar allows no token that the "
                    "other settings (min_length, bad_words) allow"
                )
                self._retire(seq, "error", new_tokens=j + 1)
                return
            if seq.params.return_generation_logits:
                out.generation_logits.append(picks.raw[picks.rows[j]].float().cpu())
            if log_probs is not None:
                out.log_probs.append(log_probs[j])
                if seq.params.num_top_log_probs:
                    out.top_ids.append(log_probs.top_ids[j])
                    out.top_log_probs.append(log_probs.top_values[j])
            if seq.text is not None:
                out.texts.append(seq.text.add([token]))
            reason = finish_reason(seq, self.runner.config.max_seq_len)
            if reason:
                tokens = tokens[: j + 1]
                break
        seq.last_event = end
        if reason:
            self.scheduler.finish(seq)
            self._retire(seq, reason, new_tokens=len(tokens))
            return
        if proposed or seq.spec_tokens:  # rejected proposals give their slots back
            self.blocks.rollback(seq, proposed - (len(tokens) - 1))
        self.on_output(seq, len(tokens))

    def _keep_prompt_logits(self, seq: Sequence, logits: torch.Tensor) -> None:
        """Keeps the logits of the prompt positions of this chunk not kept yet (a recompute after a
        preemption feeds them again)."""
        kept = seq.out.prompt_logits
        have = sum(t.shape[0] for t in kept)
        first = seq.num_computed  # the chunk's first position (num_computed not advanced yet)
        rows = logits[max(have - first, 0) : len(seq.prompt_ids) - first]
        if rows.shape[0]:
            kept.append(rows.float().cpu())
