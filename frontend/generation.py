"""Reads the ensemble's streamed responses as `Step`s: the new text, the tokens, and the finish reason.

API-neutral: the TGI route (and later ones) shape these into their own JSON.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from frontend.errors import APIError
from frontend.triton import ENSEMBLE


class Triton(Protocol):
    """What the routes need from Triton; `frontend.triton.TritonClient` or a test fake."""

    def stream(self, model: str, inputs: dict[str, np.ndarray]) -> AsyncIterator[dict[str, np.ndarray]]: ...

    async def infer(self, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    async def ready(self, models: Iterable[str]) -> bool: ...


@dataclass
class Token:
    id: int
    text: str  # this token's text decoded alone
    logprob: float | None
    special: bool


@dataclass
class Step:
    text: str  # new text of this response; "" while postprocessing holds text back
    tokens: list[Token]
    finish_reason: str  # "" until the final response, then one of contract.FINISH_REASONS
    prompt_tokens: int | None


@dataclass
class Generation:
    text: str = ""
    tokens: list[Token] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int | None = None

    def add(self, step: Step) -> None:
        self.text += step.text
        self.tokens.extend(step.tokens)
        self.finish_reason = step.finish_reason or self.finish_reason
        self.prompt_tokens = step.prompt_tokens if step.prompt_tokens is not None else self.prompt_tokens


def _strings(array: np.ndarray | None) -> list[str]:
    if array is None:
        return []
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def _finite(value: float) -> float | None:
    # JSON has no -inf/NaN; a logprob that is not a number is reported as unknown.
    return float(value) if math.isfinite(value) else None


def parse_step(outputs: dict[str, np.ndarray], with_logprobs: bool) -> Step:
    ids = [int(i) for i in outputs.get("output_ids", np.zeros((1, 0), np.int32)).reshape(-1)]
    n = len(ids)
    texts = _strings(outputs.get("token_texts"))
    special = [bool(s) for s in outputs.get("token_special", np.zeros(0, np.bool_)).reshape(-1)]
    # Log probs are zeros (or absent) unless requested; report them only when they are real.
    raw = outputs.get("output_log_probs")
    logprobs = [_finite(v) for v in raw.reshape(-1)] if with_logprobs and raw is not None else []
    tokens = [
        Token(
            id=ids[i],
            text=texts[i] if i < len(texts) else "",
            logprob=logprobs[i] if i < len(logprobs) else None,
            special=special[i] if i < len(special) else False,
        )
        for i in range(n)
    ]
    prompt = outputs.get("prompt_tokens")
    reason = _strings(outputs.get("finish_reason"))
    return Step(
        text="".join(_strings(outputs.get("text_output"))),
        tokens=tokens,
        finish_reason=reason[0] if reason else "",
        prompt_tokens=int(prompt.reshape(-1)[0]) if prompt is not None and prompt.size else None,
    )


async def steps(
    triton: Triton, inputs: dict[str, np.ndarray], with_logprobs: bool
) -> AsyncGenerator[Step, None]:
    # aclosing: closing this generator must close Triton's stream now (which cancels the request),
    # not whenever the garbage collector gets to it.
    async with contextlib.aclosing(triton.stream(ENSEMBLE, inputs)) as responses:
        async for outputs in responses:
            yield parse_step(outputs, with_logprobs)


async def generate(triton: Triton, inputs: dict[str, np.ndarray], with_logprobs: bool) -> Generation:
    result = Generation()
    async with contextlib.aclosing(steps(triton, inputs, with_logprobs)) as stream:
        async for step in stream:
            result.add(step)
    if not result.finish_reason:
        raise APIError(500, "inference failed: the generation ended without a finish reason")
    return result
