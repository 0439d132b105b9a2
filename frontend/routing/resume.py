"""A stream that outlives its replica: what the router keeps of an engine stream while it runs, and
the request that continues it on another replica.

The continuation is the same request with the output tokens already sent appended to `input_ids`
(ids, never re-tokenized text) and `resume_output_len` saying how many they are: the engine starts
the sequence's output with them, so the budget left, min_length, penalties, the guide, stop words
and strings and the detokenizer's state all continue, and a seeded draw is a function of the seed
and the token's position (tritonlm/sampling/draws.py), so greedy and seeded streams go on exactly
as the first replica would have. The client sees one stream: the only thing the router changes in
the responses is `cum_log_probs`, which the new replica counts from the resumed point.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import numpy as np

from frontend.errors import APIError
from tritonlm.contract import ENGINE, ENGINE_INPUTS, NUMPY_DTYPES
from tritonlm.serving.model_set import kind_of

RESUME_TENSOR = "resume_output_len"
_IDS_DTYPE = NUMPY_DTYPES[next(t.dtype for t in ENGINE_INPUTS if t.name == "input_ids")]
_COUNT_DTYPE = NUMPY_DTYPES[next(t.dtype for t in ENGINE_INPUTS if t.name == RESUME_TENSOR)]
# Outputs the first response alone carries (the prompt's): not asked again of the new replica.
_PROMPT_ONLY = ("return_prompt_log_probs", "return_context_logits")

Arrays = dict[str, np.ndarray]


def _scalar(inputs: Mapping[str, np.ndarray], name: str, default: int) -> int:
    value = inputs.get(name)
    return default if value is None or not value.size else int(value.reshape(-1)[0])


def cannot_resume(model: str, inputs: Mapping[str, np.ndarray], wanted: Collection[str] | None) -> str:
    """Why a started stream cannot be continued elsewhere ("" when it can)."""
    if kind_of(model) != ENGINE:
        return f"a stream of the {model} model"
    if _scalar(inputs, "beam_width", 1) > 1:
        return "a beam search"  # answers once, at the end: never started, so retried whole instead
    if "draft_input_ids" in inputs:
        return "a stream verifying draft tokens"
    if wanted is not None and "output_ids" not in wanted:
        return "a stream that does not report its output_ids"
    return ""


def lost(error: APIError, why: str) -> APIError:
    """The error a client gets for a stream that cannot be resumed: the failure, and why not."""
    return APIError(error.status, f"{error.message} (the stream had started, and {why} cannot be resumed)")


class Progress:
    """What an engine stream has given its client so far: the output tokens (beam 0, the only one
    of a streamed request) and the last cumulative log prob."""

    def __init__(self) -> None:
        self.responses = 0
        self.tokens: list[int] = []
        self.cum_log_prob: float | None = None
        self._cum_offset = 0.0  # what the replicas before this one counted

    def add(self, response: Arrays) -> Arrays:
        """Records a response and returns it as the client must see it."""
        self.responses += 1
        ids = response.get("output_ids")
        if ids is not None and ids.size:
            row = ids.reshape(ids.shape[0] if ids.ndim > 1 else 1, -1)[0]
            lengths = response.get("sequence_length")
            n = int(lengths.reshape(-1)[0]) if lengths is not None and lengths.size else row.size
            self.tokens.extend(int(t) for t in row[:n])
        cum = response.get("cum_log_probs")
        if cum is not None and cum.size:
            if self._cum_offset:
                response = {**response, "cum_log_probs": (cum + self._cum_offset).astype(cum.dtype)}
            self.cum_log_prob = float(response["cum_log_probs"].reshape(-1)[0])
        return response

    def resumed(self, inputs: Mapping[str, np.ndarray]) -> Arrays:
        """`inputs` continued after the tokens sent so far (the original request's inputs)."""
        self._cum_offset = self.cum_log_prob or 0.0
        given = np.asarray(inputs["input_ids"])
        ids = given.reshape(-1)
        ids = np.concatenate([ids[: _scalar(inputs, "input_lengths", ids.size)], self.tokens])
        feed = {k: v for k, v in inputs.items() if k not in ("input_lengths", *_PROMPT_ONLY)}
        feed["input_ids"] = ids.astype(_IDS_DTYPE).reshape((1, -1) if given.ndim == 2 else (-1,))
        count = _scalar(inputs, RESUME_TENSOR, 0) + len(self.tokens)
        feed[RESUME_TENSOR] = np.array([count], _COUNT_DTYPE)
        return feed
