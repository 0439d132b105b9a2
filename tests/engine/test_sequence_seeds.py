"""A request's sequences draw with seed + i, by the same rule the frontend seeds an API's `n` with."""

from __future__ import annotations

from tritonlm.engine.request import Request
from tritonlm.sampling.params import SamplingParams
from tritonlm.sampling.seeds import SEED_SPACE


def test_sequence_i_of_a_request_draws_with_seed_plus_i():
    params = SamplingParams(seed=SEED_SPACE - 1)
    request = Request(prompt_ids=(1, 2), max_new_tokens=1, params=params, num_return_sequences=3)
    assert [r.params.seed for r in request.sequences()] == [SEED_SPACE - 1, 0, 1]
    unseeded = Request(prompt_ids=(1,), max_new_tokens=1, params=SamplingParams(), num_return_sequences=2)
    assert [r.params.seed for r in unseeded.sequences()] == [None, None]
