"""Builds engine Sequences for tests the way the Triton adapter does: an immutable Request, then the
Sequence that runs it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from transformers import AutoModelForCausalLM

from tritonlm.engine.request import Request
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import fused


def sequence(
    prompt: Iterable[int],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    *,
    is_cancelled: Callable[[], bool] | None = None,
    stop_words: Iterable[Iterable[int]] = (),
    **request_fields: object,
) -> Sequence:
    request = Request(
        tuple(prompt),
        max_new_tokens,
        params or SamplingParams(),
        stop_words=tuple(tuple(w) for w in stop_words),
        **request_fields,
    )
    seq = Sequence(request)
    if is_cancelled is not None:
        seq.is_cancelled = is_cancelled
    return seq


def reference_model(model_dir: object, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' model with the projections the engine runs by default (`fuse_projections`):
    logits compared at float32 noise (1e-4) need the same matrix multiplies on both sides, since
    oneDNN's pre-packed sgemm sums in another order than MKL's (tests/test_fused.py compares the two)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    fused.fuse(model)
    return model
