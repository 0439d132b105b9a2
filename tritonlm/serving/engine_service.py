"""The engine behind Triton (decoupled): what `model_repository/engine/1/model.py` delegates to.

`submit` parses each request and hands it to the engine loop thread, then returns at once. The
engine reports new tokens through a queue to the sender thread, which turns them into responses and
sends each round of them at once (a few threads, one request each); a watcher thread asks Triton
which requests were cancelled, and a metrics thread publishes the engine's statistics
(serving.metrics).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import triton_python_backend_utils as pb_utils

from tritonlm import contract, platforms
from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.sequence import Sequence
from tritonlm.errors import overloaded_message
from tritonlm.lora.store import LoraCacheFull, LoraStore
from tritonlm.serving import triton_glue
from tritonlm.serving.coalesce import coalesce
from tritonlm.serving.engine_inputs import InvalidRequest, parse_request
from tritonlm.serving.engine_outputs import ALL_OUTPUTS, ResponseBuilder
from tritonlm.serving.metrics import EngineMetrics
from tritonlm.text.postprocess import TEXT_NAMES
from tritonlm.text.tokenization import load_tokenizer
from tritonlm.worker.model_runner import ModelRunner

log = logging.getLogger("engine")

# The engine's inputs under every name it accepts (contract aliases included).
ENGINE_INPUT_NAMES = contract.with_aliases(contract.ENGINE_INPUTS)
STOP_TIMEOUT_S = 2.0  # unloading waits at most this long for the engine's threads
# Requests whose responses go out at once. Each send waits for the server to take the response
# (a round trip through the stub's message queue): one after another, a step's responses trickle
# out over milliseconds and every process downstream wakes once for each; sent together they
# travel as a burst (bench model, bf16, 32 streams: +7% tok/s, a fifth less frontend CPU).
SEND_THREADS = 4


class Outgoing(NamedTuple):
    """A response ready to go, and where: its request's response sender."""

    sender: Any
    response: Any
    flags: int  # TRITONSERVER_RESPONSE_COMPLETE_FINAL on a request's last one
    key: int  # the sequence's, for the log


@dataclass
class Siblings:
    """The sampled sequences of one request (num_return_sequences): one client, one final response
    (after the last of them), and without streaming one answer holding a row of each."""

    keys: set[int]
    running: set[int] = field(default_factory=set)  # keys of those not finished yet
    done: list[Sequence] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.running = set(self.keys)


def _build_runner(config: EngineConfig) -> ModelRunner:
    # This process serves the engine alone: its threads are the engine's.
    platforms.resolve(config.device).configure_threads(config.engine_threads())
    return ModelRunner(config)


class EngineService:
    def __init__(self, args: dict) -> None:
        config = EngineConfig.from_parameters(triton_glue.parameters(args))
        # The runner is built on the thread that steps it. torch's CPU threads are an OpenMP team per
        # calling thread (and its thread count a setting of that thread): a second team makes libgomp
        # throttle its spin-wait, and the step's workers then sleep between its hundreds of parallel
        # regions (docs/benchmarks.md, "Where one stream's token goes").
        self.loop = ThreadPoolExecutor(1, thread_name_prefix="engine-loop")
        self.runner = self.loop.submit(_build_runner, config).result()
        self.adapters = LoraStore(
            self.runner.config, self.runner.lora.shapes, self.runner.dtype, self.runner.device
        )
        self.tokenizer = load_tokenizer(self.runner.config.model_dir)
        self.responses = ResponseBuilder(self.tokenizer, self.runner.config.block_size)
        # (sequence, first token, end token, finish reason) as they were when the engine reported them
        self.outbox: queue.Queue[tuple[Sequence, int, int, str] | None] = queue.Queue()
        self.senders: dict[int, object] = {}  # Sequence.key -> response sender
        # Sequence.key -> the outputs its client asked for, when not all (Triton would drop the
        # others anyway; not building them saves the copies through the backend)
        self.wanted: dict[int, frozenset[str]] = {}
        self.senders_lock = threading.Lock()  # held while a sender is looked up or closed
        self.siblings: dict[int, Siblings] = {}  # Sequence.key -> its request's sampled sequences
        self.cancelled: set[int] = set()  # keys of requests found cancelled by the watcher thread
        self.stopping = False
        self.engine = Engine(
            self.runner,
            on_output=lambda seq, n: self.outbox.put(
                (seq, len(seq.output_ids) - n, len(seq.output_ids), seq.out.finish_reason)
            ),
            tokenizer=self.tokenizer,
        )
        # Labelled with this engine's Triton name: several engines may share the server (MODEL_DIRS).
        # max_lora: adapters one batch can mix, the named ones and the task-id cache's.
        max_lora = len(self.adapters.named) + self.adapters.max_adapters
        self.metrics = EngineMetrics(args["model_name"], max_lora)
        self.running = self.loop.submit(self.engine.run)
        self.threads = [
            threading.Thread(target=self._send_loop, name="engine-sender", daemon=True),
            threading.Thread(target=self._metrics_loop, name="engine-metrics", daemon=True),
            threading.Thread(target=self._cancel_loop, name="engine-cancel", daemon=True),
        ]
        self.send_pool = ThreadPoolExecutor(SEND_THREADS, thread_name_prefix="engine-send")
        for thread in self.threads:
            thread.start()

    def submit(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            tensors = triton_glue.read_inputs(request, ENGINE_INPUT_NAMES)
            wanted = frozenset(request.requested_output_names())  # frozen: each response reads it as is
            try:
                parsed = parse_request(
                    tensors,
                    self.runner.vocab_size,
                    self.runner.config.max_seq_len,
                    text_wanted=not wanted or bool(wanted & TEXT_NAMES),
                    adapters=self.adapters,
                    hidden_size=self.runner.hidden_size,
                    by_priority=self.runner.config.scheduling_policy == "priority",
                    recurrent_state=self.runner.state_slots > 0,
                    beam_room=self.engine.beam_room,
                )
            except InvalidRequest as error:
                sender.send(
                    triton_glue.error_response(error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
                continue
            except LoraCacheFull as error:  # like a full queue: retry later
                full = pb_utils.TritonError(str(error), pb_utils.TritonError.UNAVAILABLE)
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(pb_utils.InferenceResponse(error=full), flags=final)
                continue
            runs = parsed.sequences()  # several with num_return_sequences and sampling
            keys = [r.key for r in runs]
            siblings = Siblings(set(keys)) if len(runs) > 1 else None
            for key in keys:  # before the engine may report on them
                self.senders[key] = sender
                if wanted and wanted != ALL_OUTPUTS:
                    self.wanted[key] = wanted
                if siblings is not None:
                    self.siblings[key] = siblings
            # None: the waiting queue is full: refuse now, do not queue.
            added = self.engine.add_all(
                runs, is_cancelled=lambda keys=keys: bool(self.cancelled.intersection(keys))
            )
            if added is None:
                self.adapters.release(parsed.lora)
                message = overloaded_message(self.engine.stats()["waiting"])
                error = pb_utils.TritonError(message, pb_utils.TritonError.UNAVAILABLE)
                with self.senders_lock:  # see _send_loop
                    self._close(keys)
                    sender.send(
                        pb_utils.InferenceResponse(error=error),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
        return None

    def _send_loop(self) -> None:
        while True:
            pending = self._take_pending()
            by_request: dict[int, list[Outgoing]] = {}
            for item in pending:
                if item is not None and (outgoing := self._response(*item)) is not None:
                    by_request.setdefault(id(outgoing.sender), []).append(outgoing)
            # Each request's responses in order (a final one last), the requests at once; the round
            # is over before the next begins, so every stream stays in order.
            list(self.send_pool.map(self._deliver, by_request.values()))
            if None in pending:
                return

    @staticmethod
    def _deliver(responses: list[Outgoing]) -> None:
        for out in responses:
            try:
                out.sender.send(out.response, flags=out.flags)
            except Exception as error:  # the client is gone; the engine already dropped it
                log.info("could not send a response for request %d: %s", out.key, error)

    def _take_pending(self) -> list[tuple[Sequence, int, int, str] | None]:
        """Everything in the outbox (waiting for the first), coalesced per stream."""
        items = [self.outbox.get()]
        with contextlib.suppress(queue.Empty):
            while True:
                items.append(self.outbox.get_nowait())
        return coalesce(items)

    def _response(self, seq: Sequence, first: int, end: int, finish_reason: str) -> Outgoing | None:
        """The response for the engine's report of tokens [first, end) of `seq`, if one is due (a
        request's final one forgets its sender and state)."""
        sender = self.senders.get(seq.key)
        if sender is None:  # a sibling sequence failed: the request was answered and closed
            self.cancelled.discard(seq.key)
            return None
        done = bool(finish_reason)
        siblings = self.siblings.get(seq.key)
        if siblings is not None and done:
            siblings.running.discard(seq.key)
            siblings.done.append(seq)
        # The request's final response: its last sequence's (or an error, which ends them all).
        last = done and (siblings is None or not siblings.running or bool(seq.out.error))
        streaming = seq.request.streaming
        if not streaming and not last:
            return None
        first = first if streaming else len(seq.request.resumed_ids)
        wanted = self.wanted.pop(seq.key, None) if done else self.wanted.get(seq.key)
        if seq.out.error:
            self.responses.forget(seq)
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(seq.out.error))
        else:
            if siblings is not None and not streaming:
                rows = sorted(siblings.done, key=lambda s: s.request.sequence_index)
                tensors = self.responses.build_rows(rows, wanted)
            else:
                tensors = self.responses.build(seq, first, end, finish_reason, wanted)
            response = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(name, value) for name, value in tensors.items()]
            )
        if not last:
            return Outgoing(sender, response, 0, seq.key)
        # After the final response Triton frees the request's response factory, and asking it
        # `is_cancelled` then crashes the server: the watcher (which looks senders up under the
        # lock) must never find a sender whose final response may be on its way.
        with self.senders_lock:
            keys = siblings.keys if siblings is not None else {seq.key}
            self.cancelled.update(keys - {seq.key})  # siblings still running stop (after an error)
            self._close(keys)
            self.cancelled.discard(seq.key)
            self.adapters.release(seq.request.lora)
        return Outgoing(sender, response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL, seq.key)

    def _close(self, keys: set[int] | list[int]) -> None:
        """Forgets a request's sequences' senders and state (under senders_lock)."""
        for key in keys:
            self.senders.pop(key, None)
            self.wanted.pop(key, None)
            self.siblings.pop(key, None)

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
        while not self.stopping:
            try:
                self.metrics.update(self.engine)
            except Exception:  # metrics must never take the engine down
                log.exception("could not update the engine metrics")
            time.sleep(0.5)  # each changed value is a message to the server

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Unload: every thread is told to stop and joined, within `timeout` in all (a step in
        progress finishes first); requests still open get a final error so no client waits on them."""
        self.stopping = True
        self.engine.stop()
        self.outbox.put(None)
        deadline = time.monotonic() + timeout
        futures.wait([self.running], timeout)
        self.loop.shutdown(wait=False)
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self.threads if thread.is_alive()]
        alive += [] if self.running.done() else ["engine-loop"]
        if alive:
            log.warning("engine threads still running at unload: %s", ", ".join(alive))
        # Idle once the sender has returned. If it has not, its round still goes out: a final
        # response in it has left `senders` already, and cancelling it would leave that request unanswered.
        self.send_pool.shutdown(wait=False)
        with self.senders_lock:
            open_requests, self.senders = self.senders, {}
        error = pb_utils.TritonError("server shutting down", pb_utils.TritonError.UNAVAILABLE)
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for sender in open_requests.values():
            with contextlib.suppress(Exception):  # the client or the server may be gone already
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
