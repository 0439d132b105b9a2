"""When a sequence is done: the finish reason after its newest token, or "" to go on; and the
text stream that finds its stop strings (and makes its text)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tritonlm.engine.request import Request
from tritonlm.text.stream import TextStream, stop_texts

if TYPE_CHECKING:  # the sequence builds its text stream here
    from tritonlm.engine.sequence import Sequence


def text_stream(request: Request, tokenizer: Any) -> TextStream | None:
    """A sequence's text stream, when it needs one: it has stop strings (or stop words, also looked
    for as text) or its client wants text. Beam search makes its texts at the end instead."""
    if tokenizer is None or request.beam_width > 1:
        return None
    stops = stop_texts(tokenizer, request.stop_strings, request.stop_words)
    if not stops and not request.text_wanted:
        return None
    return TextStream(
        tokenizer,
        request.skip_special_tokens,
        stops,
        request.include_stop_str_in_output,
        armed_at=request.params.min_length,  # stop words count from min_length on
    )


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
