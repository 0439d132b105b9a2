"""Postprocessing, Triton-free: engine responses -> text, with per-request streaming state.

The responses of one streaming request reach postprocessing as successive requests, in order, all
carrying the engine's `request_key`; the text of each depends on the tokens before it, so the
detokenizer and stop-string state live here between calls, until the response with a finish reason.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritonlm import contract
from tritonlm.detokenizer import IncrementalDetokenizer, StopStringFilter
from tritonlm.errors import InvalidRequest
from tritonlm.preprocess import scalar, strings
from tritonlm.tokenization import list_to_words, special_ids, token_texts

_OUT = contract.by_name(contract.POSTPROCESSING_OUTPUTS)
# Cancelled or abandoned requests never send a finish reason; this bounds what they leave behind.
MAX_STREAMS = 4096


def _array(name: str, value: Any) -> np.ndarray:
    return np.asarray(value, dtype=contract.NUMPY_DTYPES[_OUT[name].dtype])


@dataclass
class _Stream:
    """One request's text state: a detokenizer and a stop filter per beam."""

    skip_special_tokens: bool
    stop_strings: list[str]
    include_stop: bool
    detokenizers: list[IncrementalDetokenizer] = field(default_factory=list)
    filters: list[StopStringFilter] = field(default_factory=list)

    def step(self, tokenizer: Any, beam: int, ids: list[int], final: bool) -> str:
        while len(self.detokenizers) <= beam:
            self.detokenizers.append(IncrementalDetokenizer(tokenizer, self.skip_special_tokens))
            self.filters.append(StopStringFilter(self.stop_strings, self.include_stop))
        detok, stop = self.detokenizers[beam], self.filters[beam]
        text = detok.add(ids)
        if final:
            text += detok.flush()
        text = stop.push(text)
        return text + stop.flush() if final else text


class Postprocessor:
    """Turns engine responses into text for one tokenizer; keeps state for unfinished requests."""

    def __init__(self, tokenizer: Any, max_streams: int = MAX_STREAMS, include_stop: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_streams = max_streams
        self.include_stop = include_stop  # keep the matched stop string at the end of the text
        self._special = special_ids(tokenizer)
        self._streams: OrderedDict[int, _Stream] = OrderedDict()

    def __len__(self) -> int:
        """Requests with state held (started and not yet finished)."""
        return len(self._streams)

    def __contains__(self, request_key: int) -> bool:
        return int(request_key) in self._streams

    def process(self, inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """One engine response (contract.POSTPROCESSING_INPUTS) -> contract.POSTPROCESSING_OUTPUTS.

        `output_ids` [beam, n] holds this response's new tokens; a non-empty `finish_reason`
        marks the request's last response, which flushes held-back text and drops the state.
        """
        key = scalar(inputs, "request_key")
        if key is None:
            raise InvalidRequest("request_key is required")
        ids = self._output_ids(inputs)
        reasons = strings(inputs, "finish_reason")  # strings() drops the "" of unfinished beams
        final = bool(reasons)

        stream = self._stream(int(key), inputs)
        texts = [stream.step(self.tokenizer, b, ids[b].tolist(), final) for b in range(ids.shape[0])]
        if final:
            self._streams.pop(int(key), None)

        first = ids[0].tolist() if ids.shape[0] else []
        out = {
            "text_output": _array("text_output", [t.encode("utf-8") for t in texts]),
            "token_texts": _array(
                "token_texts", [t.encode("utf-8") for t in token_texts(self.tokenizer, first)]
            ),
            "token_special": _array("token_special", [i in self._special for i in first]),
        }
        for name in contract.PASSTHROUGH:
            if inputs.get(name) is not None:
                out[f"out_{name}"] = inputs[name]
        return out

    @staticmethod
    def _output_ids(inputs: Mapping[str, np.ndarray | None]) -> np.ndarray:
        arr = inputs.get("output_ids")
        if arr is None:
            raise InvalidRequest("output_ids is required")
        arr = np.asarray(arr)
        if arr.ndim == 1:  # a single beam without its beam dimension
            arr = arr[None, :]
        if arr.ndim != 2:
            raise InvalidRequest(f"output_ids must have shape [beam, n], got {list(arr.shape)}")
        return arr

    def _stream(self, key: int, inputs: Mapping[str, np.ndarray | None]) -> _Stream:
        stream = self._streams.get(key)
        if stream is not None:
            self._streams.move_to_end(key)
            return stream
        stop_ids = inputs.get("stop_words_list")
        words = list_to_words(stop_ids) if stop_ids is not None and stop_ids.size else []
        stream = _Stream(
            skip_special_tokens=True,
            stop_strings=[s for s in (self.tokenizer.decode(w) for w in words) if s],
            include_stop=self.include_stop,
        )
        self._streams[key] = stream
        while len(self._streams) > self.max_streams:
            self._streams.popitem(last=False)  # the least recently active request
        return stream
