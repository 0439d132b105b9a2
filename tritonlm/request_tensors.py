"""One request's input tensors, read by what the contract declares about them.

Every model reads its request the same way: a tensor that is absent (or None, as Triton's Python
backend hands an absent optional input) takes the contract's default; a single value may come in
any shape of one element ([1], [1, 1] or []); anything else is the client's mistake, reported as
InvalidRequest with the tensor's name first (the frontend names the API field from it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tritonlm.contract import Bounds, Tensor
from tritonlm.errors import InvalidRequest


def required(name: str) -> InvalidRequest:
    return InvalidRequest(f"{name} is required")


def _allowed(bounds: Bounds) -> str:
    """How a range reads in a message: "in [1, 16]", ">= 1", "in (0.0, 1.0]"."""
    if bounds.high == math.inf:
        return f"{'>' if bounds.low_open else '>='} {bounds.low}"
    if bounds.low == -math.inf:
        return f"<= {bounds.high}"
    return f"in {'(' if bounds.low_open else '['}{bounds.low}, {bounds.high}]"


def as_text(value: Any, name: str) -> str:
    """One BYTES element (bytes from Triton, str from tests) as text."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"{name} must be UTF-8 text ({e.reason} at byte {e.start})") from None


class RequestTensors:
    """Typed getters over one request's tensors (name -> numpy array); `declared`: the model's
    inputs in the contract, whose defaults and bounds apply (an undeclared name defaults to None)."""

    def __init__(self, tensors: Mapping[str, Any], declared: tuple[Tensor, ...] = ()) -> None:
        self.tensors = {name: np.asarray(value) for name, value in tensors.items() if value is not None}
        self.declared = {t.name: t for t in declared}
        self.given_as: dict[str, str] = {}  # tensor name -> the alias the client used for it
        for t in declared:
            for alias in t.aliases:
                if alias not in self.tensors:
                    continue
                if t.name in self.tensors:
                    raise InvalidRequest(f"{alias}: the same setting as {t.name}; give one of them")
                self.tensors[t.name] = self.tensors.pop(alias)
                self.given_as[t.name] = alias

    def named(self, name: str) -> str:
        """The name the client gave a tensor by (an alias, or its own)."""
        return self.given_as.get(name, name)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def array(self, name: str) -> np.ndarray | None:
        """The tensor as given; None when absent (an error when the contract requires it)."""
        value = self.tensors.get(name)
        if value is None and name in self.declared and not self.declared[name].optional:
            raise required(name)
        return value

    def value(self, name: str) -> Any:
        """The single value of a one-value tensor as a Python object; the default when absent."""
        arr = self.array(name)
        if arr is None:
            return self.declared[name].default if name in self.declared else None
        if arr.size != 1:
            raise InvalidRequest(f"{self.named(name)} must hold one value, got shape {list(arr.shape)}")
        return arr.reshape(-1)[:1].tolist()[0]

    def integer(self, name: str, bounds: Bounds | None = None) -> int | None:
        """`bounds`: where they depend on the model (token ids); else the contract's apply."""
        value = self.value(name)
        if value is None:
            return None
        return self._bounded(name, int(value), bounds)

    def number(self, name: str, bounds: Bounds | None = None) -> float | None:
        """A finite float within its bounds."""
        value = self.value(name)
        if value is None:
            return None
        value = float(value)
        if not math.isfinite(value):
            raise InvalidRequest(f"{self.named(name)} must be a finite number, got {value}")
        return self._bounded(name, value, bounds)

    def flag(self, name: str) -> bool:
        return bool(self.value(name))

    def text(self, name: str) -> str | None:
        value = self.value(name)
        return None if value is None else as_text(value, name)

    def texts(self, name: str) -> list[str]:
        """A BYTES [-1] tensor as its non-empty strings ([] when absent)."""
        arr = self.array(name)
        if arr is None:
            return []
        return [s for s in (as_text(v, name) for v in arr.astype(object).reshape(-1)) if s]

    def json(self, name: str) -> Any | None:
        text = self.text(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"{name} must be JSON ({e.msg} at character {e.pos})") from None

    def _bounded(self, name: str, value: float, bounds: Bounds | None) -> Any:
        declared = self.declared.get(name)
        bounds = bounds or (declared.bounds if declared else None)
        if bounds is not None and not bounds.admit(value):
            raise InvalidRequest(f"{self.named(name)} must be {_allowed(bounds)}, got {value}")
        return value


def check_table_shape(table: np.ndarray, hidden_size: int | None, min_rows: int = 1) -> None:
    """A client's `prompt_embedding_table`, wherever it is read (the engine, the multimodal
    encoder): [1, rows, hidden] with the model's hidden size (None: not known here)."""
    name = "prompt_embedding_table"
    if table.ndim != 3 or table.shape[0] != 1 or table.shape[1] < min_rows:
        raise InvalidRequest(f"{name}: expected shape [1, rows, hidden], got {list(table.shape)}")
    if hidden_size is not None and table.shape[2] != hidden_size:
        got = table.shape[2]
        raise InvalidRequest(f"{name}: rows must have the model's hidden size {hidden_size}, got {got}")
