"""The engine's response tensors (contract.ENGINE_OUTPUTS) for a slice of a sequence's tokens."""

from __future__ import annotations

import numpy as np

from tritonlm import contract
from tritonlm.sequence import Sequence
from tritonlm.tokenization import ids_to_list

_DTYPES = {t.name: contract.NUMPY_DTYPES[t.dtype] for t in contract.ENGINE_OUTPUTS}


def response_tensors(seq: Sequence, first: int, end: int, finish_reason: str) -> dict[str, np.ndarray]:
    """Tensors for the tokens `seq.output_ids[first:end]` (beam width 1). The engine thread may have
    appended more tokens since, so the caller passes the range and finish reason it was told about.
    Every declared output is present in every response (empty when not requested), so ensembles can
    route them unconditionally."""
    ids = seq.output_ids[first:end]
    timings = seq.timings[first:end]
    n = len(ids)
    log_probs = seq.log_probs[first:end] if seq.params.return_log_probs else []
    values: dict[str, object] = {
        "output_ids": [ids],
        "sequence_length": [n],
        "output_log_probs": [[log_probs]] if log_probs else np.zeros((1, 1, 0)),
        "cum_log_probs": [[sum(seq.log_probs[:end])]] if log_probs else np.zeros((1, 0)),
        "context_logits": np.zeros((1, 0, 0)),
        "generation_logits": np.zeros((1, 1, 0, 0)),
        "finish_reason": [finish_reason.encode()],
        "prompt_tokens": [len(seq.prompt_ids)],
        "batch_size": [t.batch_size for t in timings],
        "queue_wait_us": [t.queue_wait_us for t in timings],
        "prefill_ms": [seq.prefill_ms],
        "decode_ms": [t.decode_ms for t in timings],
        "request_key": [seq.key],
        "stop_words_list": ids_to_list(seq.stop_words),
    }
    return {name: np.asarray(value, dtype=_DTYPES[name]) for name, value in values.items()}
