"""Postprocessing, Triton-free: engine responses -> text, with per-request streaming state.

The responses of one streaming request reach postprocessing as successive requests, in order, all
carrying the engine's `request_key`; the text of each depends on the tokens before it, so the
text state (a `tritonlm.text.stream.TextStream` per beam) lives here between calls, until the
response with a finish reason. How to detokenize (`skip_special_tokens`), whether a matched stop
string stays in the text (`include_stop_str_in_output`) and the stop strings themselves are request
settings the engine echoes.

The engine makes the same text itself, with the same TextStream, for clients that ask it for text
(`tritonlm.serving.engine_outputs.ResponseBuilder`), so both paths give the same text.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tritonlm import contract
from tritonlm.errors import InvalidRequest
from tritonlm.request_tensors import RequestTensors, required
from tritonlm.text.stream import TextStream, stop_texts
from tritonlm.text.tokenization import list_to_words, special_ids, token_texts

_OUT = contract.by_name(contract.POSTPROCESSING_OUTPUTS)
TEXT_NAMES = frozenset(t.name for t in contract.TEXT_OUTPUTS)
# Cancelled or abandoned requests never send a finish reason; this bounds what they leave behind.
MAX_STREAMS = 4096


def _array(name: str, value: Any) -> np.ndarray:
    return np.asarray(value, dtype=contract.NUMPY_DTYPES[_OUT[name].dtype])


@dataclass
class _Stream:
    """One request's text state: a TextStream per beam."""

    skip_special_tokens: bool
    stop_strings: list[str]
    include_stop: bool
    beams: list[TextStream] = field(default_factory=list)

    def step(self, tokenizer: Any, beam: int, ids: list[int], final: bool) -> str:
        while len(self.beams) <= beam:
            self.beams.append(
                TextStream(tokenizer, self.skip_special_tokens, self.stop_strings, self.include_stop)
            )
        text = self.beams[beam].add(ids)
        return text + self.beams[beam].finish() if final else text

    def stop_reason(self, beam: int) -> str:
        return self.beams[beam].matched if beam < len(self.beams) else ""


class Postprocessor:
    """Turns engine responses into text for one tokenizer; keeps state for unfinished requests."""

    def __init__(self, tokenizer: Any, max_streams: int = MAX_STREAMS, include_stop: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_streams = max_streams
        self.include_stop = include_stop  # default of include_stop_str_in_output when not echoed
        self._special = special_ids(tokenizer)
        self._streams: OrderedDict[int, _Stream] = OrderedDict()

    def __len__(self) -> int:
        """Requests with state held (started and not yet finished)."""
        return len(self._streams)

    def __contains__(self, request_key: int) -> bool:
        return int(request_key) in self._streams

    def process(self, inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """One engine response (contract.POSTPROCESSING_INPUTS) -> contract.POSTPROCESSING_OUTPUTS:
        its texts, and the engine outputs listed in contract.PASSTHROUGH unchanged."""
        out = self.texts(inputs)
        for name in contract.PASSTHROUGH:
            value = inputs.get(name)
            if value is None:  # a caller without this engine output: zeros, empty where dims allow
                spec = _OUT[f"out_{name}"]
                shape = tuple(0 if d == -1 else d for d in spec.dims)
                value = np.zeros(shape, contract.NUMPY_DTYPES[spec.dtype])
            out[f"out_{name}"] = value
        return out

    def texts(
        self, inputs: Mapping[str, np.ndarray | None], wanted: Collection[str] = TEXT_NAMES
    ) -> dict[str, np.ndarray]:
        """The contract.TEXT_OUTPUTS in `wanted` for one engine response.

        `output_ids` [beam, n] holds this response's new tokens (beam b's first sequence_length[b]
        of them); a non-empty `finish_reason` marks the request's last response, which flushes
        held-back text and drops the state. State is kept only for requests that want the text.
        """
        tensors = RequestTensors(inputs, contract.POSTPROCESSING_INPUTS)
        key = tensors.value("request_key")
        rows = self._rows(inputs)
        reasons = tensors.texts("finish_reason")  # texts() drops the "" of unfinished beams
        final = bool(reasons)
        out: dict[str, np.ndarray] = {}
        if "text_output" in wanted or "stop_reason" in wanted:
            stream = self._stream(int(key), tensors)
            texts = [stream.step(self.tokenizer, b, row, final) for b, row in enumerate(rows)]
            stop_reasons = [stream.stop_reason(b) if final else "" for b in range(len(rows))]
            out["text_output"] = _array("text_output", [t.encode("utf-8") for t in texts])
            out["stop_reason"] = _array("stop_reason", [r.encode("utf-8") for r in stop_reasons])
        if final:
            self._streams.pop(int(key), None)
        flat = [i for row in rows for i in row]
        if "token_texts" in wanted:
            out["token_texts"] = _array("token_texts", self._texts(flat))
        if "token_special" in wanted:
            out["token_special"] = _array("token_special", [i in self._special for i in flat])
        for ids, name in (("top_ids", "top_token_texts"), ("prompt_top_ids", "prompt_top_token_texts")):
            if name in wanted:
                out[name] = self._top_texts(inputs, ids, name)
        return {name: value for name, value in out.items() if name in wanted}

    def forget(self, request_key: int) -> None:
        """Drops a request's state (it ended without a final response, e.g. with an error)."""
        self._streams.pop(int(request_key), None)

    def _texts(self, ids: list[int]) -> list[bytes]:
        return [t.encode("utf-8") for t in token_texts(self.tokenizer, ids)]

    def _top_texts(self, inputs: Mapping[str, np.ndarray | None], source: str, name: str) -> np.ndarray:
        """The text of each id of a [rows, k] id tensor, alone; "" where the id is -1 (no entry)."""
        arr = inputs.get(source)
        if arr is None or np.asarray(arr).ndim != 2:
            return _array(name, np.zeros((0, 0), dtype=object))
        arr = np.asarray(arr)
        ids = [int(i) for i in arr.reshape(-1)]
        valid = [i for i in ids if 0 <= i < len(self.tokenizer)]
        texts = iter(self._texts(valid))
        flat = [next(texts) if 0 <= i < len(self.tokenizer) else b"" for i in ids]
        return _array(name, np.array(flat, dtype=object).reshape(arr.shape))

    @staticmethod
    def _rows(inputs: Mapping[str, np.ndarray | None]) -> list[list[int]]:
        """Each beam's new token ids: its row of output_ids, cut to its sequence_length when given."""
        arr = inputs.get("output_ids")
        if arr is None:
            raise required("output_ids")
        arr = np.asarray(arr)
        if arr.ndim == 1:  # a single beam without its beam dimension
            arr = arr[None, :]
        if arr.ndim != 2:
            raise InvalidRequest(f"output_ids must have shape [beam, n], got {list(arr.shape)}")
        lengths = inputs.get("sequence_length")
        lengths = np.asarray(lengths).reshape(-1) if lengths is not None else np.zeros(0)
        if lengths.size != arr.shape[0]:
            return arr.tolist()
        return [row[: max(0, int(n))] for row, n in zip(arr.tolist(), lengths.tolist(), strict=True)]

    def _stream(self, key: int, tensors: RequestTensors) -> _Stream:
        stream = self._streams.get(key)
        if stream is not None:
            self._streams.move_to_end(key)
            return stream
        stop_ids = tensors.array("stop_words_list")
        words = list_to_words(stop_ids) if stop_ids.size else []
        include = "include_stop_str_in_output" in tensors  # else this server's default
        stream = _Stream(
            skip_special_tokens=tensors.flag("skip_special_tokens"),
            stop_strings=stop_texts(self.tokenizer, tensors.texts("stop_strings"), words),
            include_stop=tensors.flag("include_stop_str_in_output") if include else self.include_stop,
        )
        self._streams[key] = stream
        while len(self._streams) > self.max_streams:
            self._streams.popitem(last=False)  # the least recently active request
        return stream
