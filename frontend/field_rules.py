"""Field rules the APIs' schemas share, each with its one message. Each raises ValueError with what
the field allows; the error handler adds the field's path (frontend/errors.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainValidator

MAX_INT32 = 2**31 - 1
MAX_UINT64 = 2**64 - 1  # a seed: the engine's random_seed is a UINT64


def json_boolean(value: Any, optional: bool = False) -> Any:
    """`true` or `false` (or null where `optional`), never a string or a number."""
    if isinstance(value, bool) or (optional and value is None):
        return value
    raise ValueError("must be a JSON boolean (true or false)")


def number(
    low: float,
    high: float | None = None,
    *,
    integer: bool = False,
    low_open: bool = False,
    high_open: bool = False,
    also: tuple[int, ...] = (),
    says_value: bool = True,
) -> Any:
    """A JSON number in the interval [low, high] ("(" / ")" with *_open; no high: unbounded), or
    one of `also` (e.g. top_k's -1). An out-of-range value is quoted in the message unless not
    `says_value` (TGI's messages say only what is allowed)."""
    kind = "an integer" if integer else "a number"
    upper = "inf)" if high is None else f"{high}{')' if high_open else ']'}"
    interval = f"{'(' if low_open else '['}{low}, {upper}"
    allowed = f"{kind} in {interval}" + "".join(f" or {a}" for a in also)

    def check(value: Any) -> Any:
        if value is None:
            return None
        is_int = isinstance(value, int) and not isinstance(value, bool)  # JSON true is not 1
        if not (is_int if integer else is_int or isinstance(value, float)):
            raise ValueError(f"must be {allowed}")
        if value in also:
            return value
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be {allowed}")
        above = value > low if low_open else value >= low
        below = high is None or (value < high if high_open else value <= high)
        if not (above and below):
            raise ValueError(f"must be {allowed}" + (f", got {value}" if says_value else ""))
        return value

    return BeforeValidator(check)


def bounded_text(value: Any, max_chars: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_chars:
        raise ValueError(f"must be a non-empty string of at most {max_chars} characters")
    return value


def total_chars(texts: Sequence[str], max_chars: int) -> None:
    if sum(len(t) for t in texts) > max_chars:
        raise ValueError(f"must have at most {max_chars} characters in all")


PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # the engine's priority tensor is INT32


def priority(value: Any) -> int | None:
    """vLLM's request `priority`: an integer, lower runs first (null: 0). Whether the engine takes one
    other than 0 (its scheduling_policy) is the engine's to say."""
    low, high = PRIORITY_RANGE
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"must be an integer in [{low}, {high}] (lower runs first)")
    return value


Priority = Annotated[int | None, BeforeValidator(priority)]

MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's `metadata` limits


def metadata(value: Any) -> Any:
    """OpenAI's `metadata`: at most 16 string pairs, keys of at most 64 characters, values of 512."""
    if value is None:
        return None
    ok = isinstance(value, dict) and len(value) <= MAX_METADATA_PAIRS
    ok = ok and all(
        isinstance(k, str)
        and isinstance(v, str)
        and len(k) <= MAX_METADATA_KEY
        and len(v) <= MAX_METADATA_VALUE
        for k, v in value.items()
    )
    if not ok:
        raise ValueError(
            f"must be an object of at most {MAX_METADATA_PAIRS} string values, keys of at most "
            f"{MAX_METADATA_KEY} characters, values of at most {MAX_METADATA_VALUE}"
        )
    return value


Metadata = Annotated[dict[str, str] | None, BeforeValidator(metadata)]


def refused(instead: str = "leave it out (or null)") -> Any:
    """A documented parameter this server does not serve: given (not null), a 400 naming it that says
    what to send `instead`; the OpenAPI description says the same."""

    def check(value: Any) -> Any:
        if value is None:
            return None
        raise ValueError(f"not supported by this server; {instead}")

    return Annotated[Any, PlainValidator(check), Field(description=f"Not supported: {instead}.")]


def resolved_under(path: str, roots: Sequence[Path]) -> Path | None:
    """`path` resolved (symlinks and `..` followed, so the check sees where it really is) when it
    lies under one of the resolved directories `roots`, else None. OSError, ValueError (a NUL byte)
    and RuntimeError (a symlink loop) reach the caller."""
    resolved = Path(path).resolve()
    return resolved if any(resolved.is_relative_to(root) for root in roots) else None
