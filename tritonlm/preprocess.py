"""Preprocessing, Triton-free: one request's text inputs -> the engine's token inputs (numpy in and out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tritonlm import contract
from tritonlm.errors import InvalidRequest
from tritonlm.tokenization import encode_prompt, token_texts, words_to_list

_OUT = contract.by_name(contract.PREPROCESSING_OUTPUTS)


def _array(name: str, value: Any) -> np.ndarray:
    """An output tensor in the contract's dtype."""
    return np.asarray(value, dtype=contract.NUMPY_DTYPES[_OUT[name].dtype])


def as_text(value: Any, name: str) -> str:
    """One BYTES element (bytes from Triton, str from tests) as text."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"{name} must be UTF-8 text ({e.reason} at byte {e.start})") from None


def scalar(inputs: Mapping[str, np.ndarray | None], name: str) -> Any | None:
    """The single value of an input of shape [1] (or [1, 1]); None when absent or empty."""
    arr = inputs.get(name)
    if arr is None or np.asarray(arr).size == 0:
        return None
    arr = np.asarray(arr)
    if arr.size != 1:
        raise InvalidRequest(f"{name} must hold one value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def strings(inputs: Mapping[str, np.ndarray | None], name: str) -> list[str]:
    """A BYTES [-1] input as a list of non-empty strings ([] when absent)."""
    arr = inputs.get(name)
    if arr is None:
        return []
    return [s for s in (as_text(v, name) for v in np.asarray(arr, dtype=object).reshape(-1)) if s]


class Preprocessor:
    """Validates and tokenizes requests for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.default_end_id = -1 if eos is None else int(eos)  # -1: the engine stops on length only
        self.default_pad_id = int(pad) if pad is not None else max(self.default_end_id, 0)

    def process(self, inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """One request's inputs (contract.PREPROCESSING_INPUTS) -> contract.PREPROCESSING_OUTPUTS.

        Raises InvalidRequest for a client error.
        """
        raw = scalar(inputs, "text_input")
        if raw is None:
            raise InvalidRequest("text_input is required")
        text = as_text(raw, "text_input")
        if not text:
            raise InvalidRequest("text_input must not be empty")
        max_tokens = self._int(inputs, "max_tokens", low=1, required=True)
        truncate = self._int(inputs, "truncate", low=1)
        end_id = self._int(inputs, "end_id", low=-1, high=self.vocab_size - 1)
        pad_id = self._int(inputs, "pad_id", low=0, high=self.vocab_size - 1)

        ids = encode_prompt(self.tokenizer, text, truncate)
        if not ids:
            raise InvalidRequest("text_input must encode to at least 1 token")
        return {
            "input_ids": _array("input_ids", [ids]),
            "input_lengths": _array("input_lengths", [len(ids)]),
            "request_output_len": _array("request_output_len", [[max_tokens]]),
            "bad_words_list": words_to_list(self.tokenizer, strings(inputs, "bad_words")),
            "stop_words_list": words_to_list(self.tokenizer, strings(inputs, "stop_words")),
            "out_end_id": _array("out_end_id", [self.default_end_id if end_id is None else end_id]),
            "out_pad_id": _array("out_pad_id", [self.default_pad_id if pad_id is None else pad_id]),
            "input_token_texts": _array(
                "input_token_texts", [t.encode("utf-8") for t in token_texts(self.tokenizer, ids)]
            ),
        }

    @staticmethod
    def _int(
        inputs: Mapping[str, np.ndarray | None],
        name: str,
        low: int,
        high: int | None = None,
        required: bool = False,
    ) -> int | None:
        value = scalar(inputs, name)
        if value is None:
            if required:
                raise InvalidRequest(f"{name} is required")
            return None
        value = int(value)
        if value < low or (high is not None and value > high):
            allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise InvalidRequest(f"{name} must be {allowed}, got {value}")
        return value
