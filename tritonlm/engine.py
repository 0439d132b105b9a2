"""The in-flight batching loop: admit, step, retire.

One thread (`run`) owns the model and every running Sequence. Other threads only call `add` and
read `stats()`; results leave through the `on_output` callback, called on the loop thread with a
sequence and the number of tokens it gained (0 when it finished without a new token). Whoever
receives the callback must not block (Triton's adapter hands it to a sender thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from tritonlm.model_runner import ModelRunner
from tritonlm.sampling import sample
from tritonlm.sequence import Sequence, TokenTiming

log = logging.getLogger(__name__)

OutputCallback = Callable[[Sequence, int], None]


class Engine:
    def __init__(self, runner: ModelRunner, on_output: OutputCallback, detokenizer_factory=None):
        self.runner = runner
        self.on_output = on_output
        self.detokenizer_factory = detokenizer_factory  # for stop strings; None: token matching only
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots = list(range(runner.max_running_seqs - 1, -1, -1))
        self.wakeup = threading.Condition()
        self.stopped = False
        self.steps = 0
        self.max_batch_size_seen = 0
        self.tokens_generated = 0

    # -- called from other threads ------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        with self.wakeup:
            self.waiting.append(seq)
            self.wakeup.notify()

    def stop(self) -> None:
        with self.wakeup:
            self.stopped = True
            self.wakeup.notify()

    def stats(self) -> dict[str, int]:
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "free_slots": len(self.free_slots),
            "steps": self.steps,
            "max_batch_size_seen": self.max_batch_size_seen,
            "tokens_generated": self.tokens_generated,
        }

    # -- the loop thread ----------------------------------------------------------------------
    def run(self) -> None:
        while True:
            with self.wakeup:
                while not self.stopped and not self.waiting and not self.running:
                    self.wakeup.wait()
                if self.stopped:
                    break
                self._admit()
            try:
                self.step()
            except Exception as error:  # a failing step must not kill the loop: fail its requests
                log.exception("engine step failed; failing the running requests")
                for seq in self.running:
                    if not seq.finish_reason:  # some may have finished before the failure
                        seq.error = f"engine step failed: {error!r}"
                        self._retire(seq, "error")
                self.running = []

    def _admit(self) -> None:
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            seq.generator = seq.params.make_generator(self.runner.device)
            if seq.stop_strings and self.detokenizer_factory is not None:
                seq.detokenizer = self.detokenizer_factory()
            self.running.append(seq)

    def _retire(self, seq: Sequence, reason: str, new_tokens: int = 0) -> None:
        seq.finish_reason = reason
        self.free_slots.append(seq.slot)
        seq.slot = -1
        self.on_output(seq, new_tokens)

    def step(self) -> None:
        for seq in [s for s in self.running if s.is_cancelled()]:
            self.running.remove(seq)
            self._retire(seq, "cancelled")
        batch = self.running
        if not batch:
            return
        start = time.perf_counter()
        logits = self.runner.forward(
            [s.pending_ids for s in batch], [s.num_cached for s in batch], [s.slot for s in batch]
        )
        tokens, log_probs = sample(logits, [s.sampler_input() for s in batch])
        end = time.perf_counter()

        self.steps += 1
        self.max_batch_size_seen = max(self.max_batch_size_seen, len(batch))
        self.tokens_generated += len(batch)
        still_running = []
        for i, seq in enumerate(batch):
            if not seq.output_ids:
                seq.prefill_ms = (end - start) * 1e3
            seq.timings.append(
                TokenTiming(len(batch), int((start - seq.last_event) * 1e6), (end - seq.last_event) * 1e3)
            )
            seq.last_event = end
            seq.output_ids.append(tokens[i])
            if log_probs is not None and seq.params.return_log_probs:
                seq.log_probs.append(log_probs[i])
            new_text = seq.detokenizer.add([tokens[i]]) if seq.detokenizer is not None else ""
            reason = seq.check_stop(new_text, self.runner.max_seq_len)
            if reason:
                self._retire(seq, reason, new_tokens=1)
            else:
                still_running.append(seq)
                self.on_output(seq, 1)
        self.running = still_running
