"""Triton adapter for the in-flight batching engine (decoupled).

`execute` parses each request and hands it to the engine loop thread, then returns at once. The
engine reports new tokens through a queue to the sender thread, which turns them into responses.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import triton_python_backend_utils as pb_utils

from tritonlm import contract, triton_glue
from tritonlm.detokenizer import IncrementalDetokenizer
from tritonlm.engine import Engine
from tritonlm.model_runner import EngineSettings, ModelRunner
from tritonlm.outputs import response_tensors
from tritonlm.request import InvalidRequest, parse_request
from tritonlm.sequence import Sequence
from tritonlm.tokenization import load_tokenizer

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
log = logging.getLogger("engine")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = triton_glue.parameters(args)
        settings = EngineSettings.from_parameters(params, triton_glue.model_dir(params))
        self.tokenizer = load_tokenizer(settings.model_dir)
        self.runner = ModelRunner(settings)
        # (sequence, first token, end token, finish reason) as they were when the engine reported them
        self.outbox: queue.Queue[tuple[Sequence, int, int, str] | None] = queue.Queue()
        self.senders: dict[int, object] = {}  # Sequence.key -> response sender
        self.engine = Engine(
            self.runner,
            on_output=lambda seq, n: self.outbox.put(
                (seq, len(seq.output_ids) - n, len(seq.output_ids), seq.finish_reason)
            ),
            detokenizer_factory=lambda: IncrementalDetokenizer(self.tokenizer, skip_special_tokens=False),
        )
        self.metrics = _Metrics()
        self.threads = [
            threading.Thread(target=self.engine.run, name="engine-loop", daemon=True),
            threading.Thread(target=self._send_loop, name="engine-sender", daemon=True),
            threading.Thread(target=self._metrics_loop, name="engine-metrics", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            tensors = triton_glue.read_inputs(request, contract.ENGINE_INPUTS)
            try:
                seq = parse_request(tensors, self.runner.vocab_size, self.runner.max_seq_len)
            except InvalidRequest as error:
                sender.send(
                    triton_glue.error_response(error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
                continue
            # Stop words also match as text, so a stop string split differently across tokens still stops.
            seq.stop_strings = [s for s in (self.tokenizer.decode(w) for w in seq.stop_words) if s]
            seq.is_cancelled = sender.is_cancelled
            self.senders[seq.key] = sender
            self.engine.add(seq)
        return None

    def _send_loop(self) -> None:
        while (item := self.outbox.get()) is not None:
            seq, first, end, finish_reason = item
            done = bool(finish_reason)
            if not seq.streaming and not done:
                continue
            first = first if seq.streaming else 0
            sender = self.senders.pop(seq.key) if done else self.senders[seq.key]
            if seq.error:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(seq.error))
            else:
                tensors = response_tensors(seq, first, end, finish_reason)
                response = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(name, value) for name, value in tensors.items()]
                )
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0
            try:
                sender.send(response, flags=flags)
            except Exception as error:  # the client is gone; the engine already dropped the request
                log.info("could not send a response for request %d: %s", seq.key, error)

    def _metrics_loop(self) -> None:
        while True:
            self.metrics.update(self.engine.stats())
            time.sleep(0.1)

    def finalize(self) -> None:
        self.engine.stop()
        self.outbox.put(None)


class _Metrics:
    """Engine statistics as Triton custom metrics (served on Triton's metrics port)."""

    def __init__(self) -> None:
        # The family must outlive its metrics, so it is kept on the object.
        self.family = gauges = pb_utils.MetricFamily(
            name="tritonlm_engine",
            description="in-flight batching engine state",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.gauges = {
            name: gauges.Metric(labels={"stat": name})
            for name in (
                "running",
                "waiting",
                "free_slots",
                "steps",
                "max_batch_size_seen",
                "tokens_generated",
            )
        }

    def update(self, stats: dict[str, int]) -> None:
        for name, value in stats.items():
            self.gauges[name].set(value)
