"""When a sequence is done: the finish reason after its newest token, or "" to go on (its text
stream, built with the sequence, finds its stop strings)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tritonlm.engine.sequence import Sequence


def finish_reason(seq: Sequence, max_seq_len: int) -> str:
    request, output = seq.request, seq.output_ids
    params = request.params
    if output[-1] == params.end_id:  # the sampler bans end_id before min_length
        return "end_id"
    if seq.grammar is not None and seq.grammar.terminated and not seq.grammar.stop_ids:
        return "end_id"  # no end token (ignore_eos): the grammar's completion is the end
    if len(output) < params.min_length:  # stop words count from min_length on
        return _length_reason(seq, max_seq_len)
    for word in request.stop_words:
        if tuple(output[-len(word) :]) == word:
            return "stop_words"
    if seq.text is not None and seq.text.stopped:  # a stop string, possibly spanning tokens
        return "stop_words"
    return _length_reason(seq, max_seq_len)


def _length_reason(seq: Sequence, max_seq_len: int) -> str:
    output = len(seq.output_ids)
    return "length" if output >= seq.request.max_new_tokens or seq.num_tokens >= max_seq_len else ""
