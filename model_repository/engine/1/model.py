"""Triton adapter for the in-flight batching engine (decoupled).

`execute` parses each request and hands it to the engine loop thread, then returns at once. The
engine reports new tokens through a queue to the sender thread, which turns them into responses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time

import triton_python_backend_utils as pb_utils

from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.sequence import Sequence
from tritonlm.errors import overloaded_message
from tritonlm.serving import contract, triton_glue
from tritonlm.serving.engine_inputs import InvalidRequest, parse_request
from tritonlm.serving.engine_outputs import ResponseBuilder
from tritonlm.text.detokenizer import IncrementalDetokenizer
from tritonlm.text.tokenization import load_tokenizer
from tritonlm.worker.model_runner import ModelRunner

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
log = logging.getLogger("engine")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = EngineConfig.from_parameters(triton_glue.parameters(args))
        self.runner = ModelRunner(config)
        self.tokenizer = load_tokenizer(self.runner.config.model_dir)
        self.responses = ResponseBuilder(self.tokenizer)
        # (sequence, first token, end token, finish reason) as they were when the engine reported them
        self.outbox: queue.Queue[tuple[Sequence, int, int, str] | None] = queue.Queue()
        self.senders: dict[int, object] = {}  # Sequence.key -> response sender
        # Sequence.key -> the outputs its client asked for, when not all (Triton would drop the
        # others anyway; not building them saves the copies through the backend)
        self.wanted: dict[int, set[str]] = {}
        self.all_outputs = {t.name for t in contract.ENGINE_OUTPUTS}
        self.senders_lock = threading.Lock()  # held while a final response goes out
        self.cancelled: set[int] = set()  # keys of requests found cancelled by the watcher thread
        self.stopping = False
        self.engine = Engine(
            self.runner,
            on_output=lambda seq, n: self.outbox.put(
                (seq, len(seq.output_ids) - n, len(seq.output_ids), seq.out.finish_reason)
            ),
            detokenizer_factory=lambda: IncrementalDetokenizer(self.tokenizer, skip_special_tokens=False),
        )
        self.metrics = _Metrics()
        self.threads = [
            threading.Thread(target=self.engine.run, name="engine-loop", daemon=True),
            threading.Thread(target=self._send_loop, name="engine-sender", daemon=True),
            threading.Thread(target=self._metrics_loop, name="engine-metrics", daemon=True),
            threading.Thread(target=self._cancel_loop, name="engine-cancel", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            tensors = triton_glue.read_inputs(request, contract.ENGINE_INPUTS)
            try:
                parsed = parse_request(tensors, self.runner.vocab_size, self.runner.config.max_seq_len)
            except InvalidRequest as error:
                sender.send(
                    triton_glue.error_response(error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
                continue
            # Stop words also match as text, so a stop string split differently across tokens still stops.
            stop_strings = tuple(s for s in (self.tokenizer.decode(w) for w in parsed.stop_words) if s)
            seq = Sequence(
                dataclasses.replace(parsed, stop_strings=stop_strings),
                is_cancelled=lambda key=parsed.key: key in self.cancelled,
            )
            self.senders[seq.key] = sender
            wanted = set(request.requested_output_names())
            if wanted and wanted != self.all_outputs:
                self.wanted[seq.key] = wanted
            if not self.engine.add(seq):  # the waiting queue is full: refuse now, do not queue
                self.wanted.pop(seq.key, None)
                message = overloaded_message(self.engine.stats()["waiting"])
                error = pb_utils.TritonError(message, pb_utils.TritonError.UNAVAILABLE)
                with self.senders_lock:  # see _send_loop
                    del self.senders[seq.key]
                    sender.send(
                        pb_utils.InferenceResponse(error=error),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
        return None

    def _send_loop(self) -> None:
        while (item := self.outbox.get()) is not None:
            seq, first, end, finish_reason = item
            done = bool(finish_reason)
            streaming = seq.request.streaming
            if not streaming and not done:
                continue
            first = first if streaming else 0
            sender = self.senders[seq.key]
            wanted = self.wanted.pop(seq.key, None) if done else self.wanted.get(seq.key)
            if seq.out.error:
                self.responses.forget(seq)
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(seq.out.error))
            else:
                tensors = self.responses.build(seq, first, end, finish_reason, wanted)
                response = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, value) for name, value in tensors.items()]
                )
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0
            # After the final response Triton frees the request's response factory, and asking it
            # `is_cancelled` then crashes the server: the watcher must never hold a sender being closed.
            with self.senders_lock if done else contextlib.nullcontext():
                if done:
                    del self.senders[seq.key]
                    self.cancelled.discard(seq.key)
                try:
                    sender.send(response, flags=flags)
                except Exception as error:  # the client is gone; the engine already dropped it
                    log.info("could not send a response for request %d: %s", seq.key, error)

    def _cancel_loop(self) -> None:
        """Asks Triton every 0.2 s which requests were cancelled. Each `is_cancelled` is a round
        trip to the server (~0.15 ms of both processes' CPU), too slow for the engine loop to make
        for every sequence of every step, and at 32 open requests checked every 50 ms it cost a
        tenth of a core; the loop reads the set this thread fills."""
        while not self.stopping:
            for key in list(self.senders):
                with self.senders_lock:  # the sender loop may be closing this request right now
                    sender = self.senders.get(key)
                    if sender is not None and key not in self.cancelled and sender.is_cancelled():
                        self.cancelled.add(key)
            time.sleep(0.2)

    def _metrics_loop(self) -> None:
        while True:
            try:
                self.metrics.update(self.engine)
            except Exception:  # metrics must never take the engine down
                log.exception("could not update the engine metrics")
            time.sleep(0.5)  # each changed value is a message to the server

    def finalize(self) -> None:
        self.stopping = True
        self.engine.stop()
        self.outbox.put(None)


class _Metrics:
    """Engine statistics as Triton custom metrics (served on Triton's metrics port):

    - gauges `tritonlm_engine{stat=...}`: running, waiting, kv_blocks_used/free/total,
      prefix_cache_hit_rate (cached / looked-up prompt tokens since start-up), and the since-start-up
      totals steps, max_batch_size_seen, tokens_generated, preemptions, prefix_cache_queries/hits;
    - counters `tritonlm_preemptions_total`, `tritonlm_generated_tokens_total`;
    - histograms `tritonlm_time_to_first_token_seconds` (arrival to first token, per request) and
      `tritonlm_time_per_output_token_seconds` (mean gap between a request's later tokens).
    """

    TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
    TPOT_BUCKETS = [0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5]

    def __init__(self) -> None:
        # Families must outlive their metrics, so they are kept on the object.
        family = pb_utils.MetricFamily
        self.gauge_family = family("tritonlm_engine", "in-flight batching engine state", family.GAUGE)
        self.gauges: dict[str, object] = {}
        self.last: dict[str, float] = {}
        self.counter_families = {
            "preemptions": family(
                "tritonlm_preemptions_total", "running requests paused for lack of KV blocks", family.COUNTER
            ),
            "tokens_generated": family("tritonlm_generated_tokens_total", "tokens generated", family.COUNTER),
        }
        self.counters = {name: f.Metric(labels={}) for name, f in self.counter_families.items()}
        self.histogram_families = {
            "ttft": family(
                "tritonlm_time_to_first_token_seconds", "request arrival to first token", family.HISTOGRAM
            ),
            "tpot": family(
                "tritonlm_time_per_output_token_seconds",
                "mean time between a request's tokens after the first",
                family.HISTOGRAM,
            ),
        }
        self.histograms = {
            "ttft": self.histogram_families["ttft"].Metric(labels={}, buckets=self.TTFT_BUCKETS),
            "tpot": self.histogram_families["tpot"].Metric(labels={}, buckets=self.TPOT_BUCKETS),
        }

    def update(self, engine: Engine) -> None:
        stats = engine.stats()
        for name, value in stats.items():
            if self.last.get(name) == value:
                continue  # each update is a message to the server: send changes only
            if name not in self.gauges:
                self.gauges[name] = self.gauge_family.Metric(labels={"stat": name})
            self.gauges[name].set(value)
            if name in self.counters:
                self.counters[name].increment(value - self.last.get(name, 0))
            self.last[name] = value
        while engine.latencies:
            kind, seconds = engine.latencies.popleft()
            self.histograms[kind].observe(seconds)
