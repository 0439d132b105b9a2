"""When a sequence is done: the finish reason after its newest token, or "" to go on."""

from __future__ import annotations

from tritonlm.engine.sequence import Sequence


def finish_reason(seq: Sequence, new_text: str, max_seq_len: int) -> str:
    """`new_text`: the text the newest token completed, for stop strings (see Sequence.detokenizer)."""
    request, output = seq.request, seq.output_ids
    params = request.params
    if output[-1] == params.end_id:  # the sampler bans end_id before min_length
        return "end_id"
    if len(output) < params.min_length:  # stop words count from min_length on
        return _length_reason(seq, max_seq_len)
    for word in request.stop_words:
        if tuple(output[-len(word) :]) == word:
            return "stop_words"
    if request.stop_strings and new_text:
        # A stop string may straddle tokens: search the tail that could still contain a new match.
        longest = max(len(s) for s in request.stop_strings)
        seq.text_tail = (seq.text_tail + new_text)[-(longest + len(new_text)) :]
        if any(s in seq.text_tail for s in request.stop_strings):
            return "stop_words"
    return _length_reason(seq, max_seq_len)


def _length_reason(seq: Sequence, max_seq_len: int) -> str:
    output = len(seq.output_ids)
    return "length" if output >= seq.request.max_new_tokens or seq.num_tokens >= max_seq_len else ""
