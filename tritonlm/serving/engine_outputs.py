"""The engine's response tensors (contract.ENGINE_OUTPUTS) for a slice of a sequence's tokens."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cached_property, partial

import numpy as np
import torch

from tritonlm import contract
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.beam_search import Beam
from tritonlm.text.postprocess import TEXT_NAMES, Postprocessor
from tritonlm.text.tokenization import ids_to_list

_DTYPES = {t.name: contract.NUMPY_DTYPES[t.dtype] for t in contract.ENGINE_OUTPUTS}
ALL_OUTPUTS = frozenset(_DTYPES)  # every output a response may carry


def _prompt_log_probs(seq: Sequence) -> dict[str, object]:
    """The sampler's log probs of prompt tokens 1.. (token 0 has none: 0, and an alternatives row
    of -inf / -1)."""
    out = seq.out
    chosen = [0.0, *out.prompt_log_probs]
    k = seq.params.num_top_log_probs
    if k:
        top_ids: object = [[-1] * k, *out.prompt_top_ids]
        top_values: object = [[-np.inf] * k, *out.prompt_top_log_probs]
    else:
        top_ids = top_values = np.zeros((len(chosen), 0))
    return {"prompt_log_probs": chosen, "prompt_top_ids": top_ids, "prompt_top_log_probs": top_values}


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


@dataclass
class _Span:
    """Tokens [first, end) of a sequence, as one response reports them."""

    seq: Sequence
    first: int
    end: int
    finish_reason: str
    block_size: int
    timings_from: int

    @cached_property
    def ids(self) -> list[int]:
        return self.seq.output_ids[self.first : self.end]

    @cached_property
    def timings(self) -> list:
        return self.seq.out.timings[self.timings_from : self.end]

    @cached_property
    def log_probs(self) -> list[float]:
        return self.seq.out.log_probs[self.first : self.end] if self.seq.params.return_log_probs else []

    @property
    def top_k(self) -> int:
        return self.seq.params.num_top_log_probs if self.ids else 0

    @cached_property
    def prompt_log_probs(self) -> dict[str, object] | None:
        seq = self.seq
        if self.first == 0 and seq.out.prompt_positions and seq.params.return_prompt_log_probs:
            return _prompt_log_probs(seq)
        return None

    def reports(self, what: str) -> bool:
        return what in self.seq.request.reports

    @cached_property
    def perf_metrics(self) -> dict[str, list]:
        """return_perf_metrics's outputs, [value] each; none when the request did not ask."""
        seq, out = self.seq, self.seq.out
        if not self.reports("perf_metrics"):
            return {}
        reused = out.cached_tokens // self.block_size
        total = -(-(len(seq.request.prompt_ids) + len(seq.output_ids)) // self.block_size)
        return {
            "kv_cache_alloc_new_blocks": [total - reused],
            "kv_cache_reused_blocks": [reused],
            "kv_cache_alloc_total_blocks": [total],
            "arrival_time_ns": [_ns(seq.request.arrival)],
            "first_scheduled_time_ns": [_ns(out.scheduled_at)],
            "first_token_time_ns": [_ns(out.first_token_at)],
            "last_token_time_ns": [_ns(seq.last_event)],
            "acceptance_rate": [out.drafts_accepted / out.drafts_proposed if out.drafts_proposed else 0.0],
            "total_accepted_draft_tokens": [out.drafts_accepted],
            "total_draft_tokens": [out.drafts_proposed],
        }


def _perf_metric(name: str, s: _Span) -> list:
    return s.perf_metrics.get(name, [])


def _prompt_output(name: str, empty: np.ndarray, s: _Span) -> object:
    return s.prompt_log_probs[name] if s.prompt_log_probs is not None else empty


def _context_logits(s: _Span) -> object:
    out = s.seq.out
    if s.first == 0 and out.prompt_logits and s.seq.params.return_context_logits:
        return torch.cat(out.prompt_logits)[None].numpy()
    return np.zeros((1, 0, 0))


def _generation_logits(s: _Span) -> object:
    generation = s.seq.out.generation_logits
    if s.seq.params.return_generation_logits and generation and s.ids:
        return torch.stack(generation[s.first : s.end])[None, None].numpy()
    return np.zeros((1, 1, 0, 0))


# Each output of a response, built only when the response carries it.
_BUILDERS: dict[str, Callable[[_Span], object]] = {
    "output_ids": lambda s: [s.ids],
    "sequence_length": lambda s: [len(s.ids)],
    "output_log_probs": lambda s: [[s.log_probs]] if s.log_probs else np.zeros((1, 1, 0)),
    "cum_log_probs": lambda s: [[sum(s.seq.out.log_probs[: s.end])]] if s.log_probs else np.zeros((1, 0)),
    "context_logits": _context_logits,
    "generation_logits": _generation_logits,
    "finish_reason": lambda s: [s.finish_reason.encode()],
    "prompt_tokens": lambda s: [len(s.seq.request.prompt_ids)],
    "batch_size": lambda s: [t.batch_size for t in s.timings],
    "queue_wait_us": lambda s: [t.queue_wait_us for t in s.timings],
    "prefill_ms": lambda s: [s.seq.out.prefill_ms],
    "decode_ms": lambda s: [t.decode_ms for t in s.timings],
    "request_key": lambda s: [s.seq.request.key],
    "sequence_index": lambda s: [s.seq.request.sequence_index],
    "cached_tokens": lambda s: [s.seq.out.cached_tokens],
    # TensorRT-LLM's optional outputs: [value] for those the request asked for, [] for the others.
    "num_input_tokens": lambda s: [len(s.seq.request.prompt_ids)] if s.reports("num_input_tokens") else [],
    "num_output_tokens": lambda s: [len(s.ids)] if s.reports("num_output_tokens") else [],
    **{t.name: partial(_perf_metric, t.name) for t in contract.PERF_METRICS},
    "top_log_probs": lambda s: (
        s.seq.out.top_log_probs[s.first : s.end] if s.top_k else np.zeros((len(s.ids), 0))
    ),
    "top_ids": lambda s: s.seq.out.top_ids[s.first : s.end] if s.top_k else np.zeros((len(s.ids), 0)),
    "prompt_log_probs": partial(_prompt_output, "prompt_log_probs", np.zeros(0)),
    "prompt_top_log_probs": partial(_prompt_output, "prompt_top_log_probs", np.zeros((0, 0))),
    "prompt_top_ids": partial(_prompt_output, "prompt_top_ids", np.zeros((0, 0))),
    "stop_words_list": lambda s: ids_to_list(s.seq.request.stop_words),
    "stop_strings": lambda s: [t.encode("utf-8") for t in s.seq.request.stop_strings],
    "skip_special_tokens": lambda s: [s.seq.request.skip_special_tokens],
    "include_stop_str_in_output": lambda s: [s.seq.request.include_stop_str_in_output],
}


def response_tensors(
    seq: Sequence,
    first: int,
    end: int,
    finish_reason: str,
    block_size: int = 1,
    names: Collection[str] | None = None,
    timings_from: int | None = None,
) -> dict[str, np.ndarray]:
    """Tensors for the tokens `seq.output_ids[first:end]` (beam width 1). The engine thread may have
    appended more tokens since, so the caller passes the range and finish reason it was told about.
    Every declared output is present in every response (empty when not requested), so ensembles can
    route them unconditionally. `block_size`: the KV cache's, for the block counts of return_perf_metrics.
    `names`: only these outputs (None: all; only they are built). `timings_from`: the step timings
    cover the tokens from this one (None: `first`; compact_stream's final response has them all)."""
    span = _Span(seq, first, end, finish_reason, block_size, first if timings_from is None else timings_from)
    built = _BUILDERS if names is None else [name for name in _BUILDERS if name in names]
    return {name: np.asarray(_BUILDERS[name](span), dtype=_DTYPES[name]) for name in built}


def beam_response_tensors(
    seq: Sequence, beams: list, finish_reasons: list[str], block_size: int = 1
) -> dict[str, np.ndarray]:
    """The final response of a beam search request: one row per beam, best first, padded to the
    longest with the end id (`sequence_length` says where each row ends). `seq` is the request's own
    sequence (its beam group's head): it carries the prompt, the settings and the per-step timings.
    `num_return_sequences` keeps the best beams only."""
    beams = beams[: seq.request.num_return_sequences]
    finish_reasons = finish_reasons[: len(beams)]
    tensors = response_tensors(seq, 0, 0, "", block_size)
    width = max((len(b.tokens) for b in beams), default=0)
    pad = max(seq.params.end_id, 0)
    rows = [b.tokens + [pad] * (width - len(b.tokens)) for b in beams]
    log_probs = [b.log_probs + [0.0] * (width - len(b.log_probs)) for b in beams]
    values: dict[str, object] = {
        "output_ids": rows,
        "sequence_length": [len(b.tokens) for b in beams],
        "finish_reason": [r.encode() for r in finish_reasons],
        "batch_size": [t.batch_size for t in seq.out.timings],
        "queue_wait_us": [t.queue_wait_us for t in seq.out.timings],
        "decode_ms": [t.decode_ms for t in seq.out.timings],
    }
    if "num_output_tokens" in seq.request.reports:
        values["num_output_tokens"] = [len(beams[0].tokens) if beams else 0]
    if seq.params.return_log_probs:
        values["output_log_probs"] = [log_probs]
        values["cum_log_probs"] = [[b.cum_log_prob for b in beams]]
    tensors.update({name: np.asarray(v, dtype=_DTYPES[name]) for name, v in values.items()})
    # Alternatives per token of every beam, beam after beam (no padding).
    k = seq.params.num_top_log_probs
    tokens = sum(len(b.tokens) for b in beams)
    top_ids = [row for b in beams for row in b.top_ids] if k else np.zeros((tokens, 0))
    top_values = [row for b in beams for row in b.top_log_probs] if k else np.zeros((tokens, 0))
    tensors["top_ids"] = np.asarray(top_ids, dtype=np.int32).reshape(tokens, k)
    tensors["top_log_probs"] = np.asarray(top_values, dtype=np.float32).reshape(tokens, k)
    return tensors


_STREAM_TEXTS = frozenset({"text_output", "stop_reason"})
_TEXT_SOURCES = frozenset(t.name for t in contract.POSTPROCESSING_INPUTS)


class ResponseBuilder:
    """A response's tensors, only those its client asked for. A client that takes text from the
    engine (contract.TEXT_OUTPUTS) saves a round trip to postprocessing per response: `text_output`
    and `stop_reason` come from the sequence's own TextStream (made on the engine loop, which also
    decided the stop strings with it), the per-token texts from postprocessing's stateless helpers,
    and a beam search's texts from postprocessing itself, once, at the end."""

    def __init__(self, tokenizer: object, block_size: int = 1) -> None:
        self.text = Postprocessor(tokenizer)
        self.block_size = block_size

    def build(
        self, seq: Sequence, first: int, end: int, finish_reason: str, wanted: Collection[str] | None
    ) -> dict[str, np.ndarray]:
        """`wanted`: the output names the client asked for; None: all of them."""
        group = seq.group
        names = _response_names(seq, first, finish_reason, wanted)
        texts = TEXT_NAMES if names is None else TEXT_NAMES.intersection(names)
        beams = group is not None and bool(group.results)
        if beams:
            tensors = beam_response_tensors(seq, group.results, group.finish_reasons(), self.block_size)
        else:
            # Texts other than the stream's are made from the response's tensors, as postprocessing would.
            built = names
            if names is not None and (texts - _STREAM_TEXTS or seq.request.echo_prompt):
                built = frozenset(names) | _TEXT_SOURCES
            all_timings = seq.request.compact_stream and bool(finish_reason)
            timings_from = 0 if all_timings else None
            tensors = response_tensors(seq, first, end, finish_reason, self.block_size, built, timings_from)
        if seq.request.echo_prompt:
            _with_prompt(seq, tensors)
        if beams or seq.request.echo_prompt:  # whole rows, answered once: their texts made from them
            tensors.update(self.text.texts(tensors, texts))
        else:
            if texts - _STREAM_TEXTS:
                tensors.update(self.text.texts(tensors, texts - _STREAM_TEXTS))
            if texts & _STREAM_TEXTS:
                tensors.update(_stream_texts(seq, first, end, finish_reason, texts))
        return tensors if names is None else {name: tensors[name] for name in names if name in tensors}

    def build_rows(self, seqs: list[Sequence], wanted: Collection[str] | None) -> dict[str, np.ndarray]:
        """The one answer of a request not streamed that ran several sampled sequences (its
        num_return_sequences, in sequence_index order): a row of each, as a beam search's answer is
        laid out; the timings are the first sequence's."""
        first = seqs[0]
        rows = [_as_row(seq) for seq in seqs]
        tensors = beam_response_tensors(first, rows, [s.out.finish_reason for s in seqs], self.block_size)
        tensors["sequence_index"] = np.asarray(
            [s.request.sequence_index for s in seqs], _DTYPES["sequence_index"]
        )
        if "num_output_tokens" in first.request.reports:
            tensors["num_output_tokens"] = np.asarray(
                [sum(len(r.tokens) for r in rows)], _DTYPES["num_output_tokens"]
            )
        if first.request.echo_prompt:
            _with_prompt(first, tensors)
        texts = TEXT_NAMES if wanted is None else TEXT_NAMES.intersection(wanted)
        tensors.update(self.text.texts(tensors, texts))
        return tensors if wanted is None else {name: tensors[name] for name in wanted if name in tensors}

    def forget(self, seq: Sequence) -> None:
        """The request ended without a final response (an error): drop its text state."""
        self.text.forget(seq.key)


def _as_row(seq: Sequence) -> Beam:
    """A sampled sequence's tokens, log probs and alternatives, as a row of a several-row answer."""
    out = seq.out
    return Beam(list(seq.output_ids), list(out.log_probs), 0.0, list(out.top_ids), list(out.top_log_probs))


def _with_prompt(seq: Sequence, tensors: dict[str, np.ndarray]) -> None:
    """exclude_input_in_output false (a response that is not streamed): every row of output_ids
    starts with the prompt and its sequence_length counts it, as TensorRT-LLM's outputs do. The log
    probs, alternatives and num_output_tokens stay per generated token, as TensorRT-LLM's do."""
    prompt = np.asarray(seq.request.prompt_ids, dtype=_DTYPES["output_ids"])
    rows = tensors["output_ids"]
    tensors["output_ids"] = np.concatenate([np.broadcast_to(prompt, (len(rows), len(prompt))), rows], axis=1)
    tensors["sequence_length"] = tensors["sequence_length"] + len(prompt)


def _stream_texts(
    seq: Sequence, first: int, end: int, finish_reason: str, names: Collection[str]
) -> dict[str, np.ndarray]:
    """`text_output` and `stop_reason` (those in `names`) of tokens [first, end) from the
    sequence's text stream."""
    out = seq.out
    texts: dict[str, np.ndarray] = {}
    if "text_output" in names:
        text = "".join(out.texts[first:end]) + (out.text_end if finish_reason else "")
        texts["text_output"] = np.asarray([text.encode("utf-8")], dtype=_DTYPES["text_output"])
    if "stop_reason" in names:
        matched = seq.text.matched if seq.text is not None and finish_reason else ""
        texts["stop_reason"] = np.asarray([matched.encode("utf-8")], dtype=_DTYPES["stop_reason"])
    return texts


def _response_names(
    seq: Sequence, first: int, finish_reason: str, wanted: Collection[str] | None
) -> Collection[str] | None:
    """The outputs of this response: those asked for (None: all), and with compact_stream only the
    new tokens' between a stream's first response and its final one; its first response has the
    rest too, but the step timings, which its final one has for every token."""
    if not seq.request.compact_stream or finish_reason:
        return wanted
    asked = ALL_OUTPUTS if wanted is None else frozenset(wanted)
    if first == len(seq.request.resumed_ids):
        return asked - contract.STEP_TIMINGS
    return asked & contract.PER_TOKEN_OUTPUTS
