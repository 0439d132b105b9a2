"""Turns the engine's request tensors (seed 003) into a Request, or a clear error naming a tensor."""

from __future__ import annotations

import math

import numpy as np
import torch

from tritonlm.engine.request import Guide, Request
from tritonlm.errors import InvalidRequest
from tritonlm.sampling.params import SamplingParams
from tritonlm.serving import contract
from tritonlm.text.preprocess import as_text, strings
from tritonlm.text.tokenization import list_to_words

_INPUTS = contract.by_name(contract.ENGINE_INPUTS)
MAX_TOP_LOG_PROBS = 20
MAX_BEAM_WIDTH = 16


def _scalar(tensors: dict[str, np.ndarray], name: str) -> object:
    if name not in tensors:
        return _INPUTS[name].default
    value = tensors[name]
    if value.size != 1:
        raise InvalidRequest(f"{name}: expected one value, got shape {list(value.shape)}")
    return value.reshape(-1)[0].item()


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidRequest(message)


def parse_word_list(tensors: dict[str, np.ndarray], name: str, vocab_size: int) -> list[list[int]]:
    """TensorRT-LLM's [2, N] format: row 0 concatenated ids, row 1 end offsets padded with -1."""
    if name not in tensors:
        return []
    try:
        words = list_to_words(tensors[name])
    except ValueError as error:
        raise InvalidRequest(f"{name}: {error}") from None
    _check(
        all(0 <= t < vocab_size for w in words for t in w), f"{name}: token ids must be in [0, {vocab_size})"
    )
    return words


def parse_request(
    tensors: dict[str, np.ndarray], vocab_size: int, max_seq_len: int, text_wanted: bool = False
) -> Request:
    """`text_wanted`: the client asked for text outputs (the engine then makes them as it goes)."""
    unimplemented = [n for n in contract.ENGINE_UNIMPLEMENTED if n in tensors]
    _check(not unimplemented, f"{', '.join(unimplemented)}: not supported by this engine yet")
    beam_width = _scalar(tensors, "beam_width")
    _check(
        1 <= beam_width <= MAX_BEAM_WIDTH, f"beam_width: must be in [1, {MAX_BEAM_WIDTH}], got {beam_width}"
    )
    if beam_width == 1:  # beam search settings: meaningless without beams
        for name in ("len_penalty", "early_stopping"):
            value = _scalar(tensors, name)
            _check(value == _INPUTS[name].default, f"{name}: only applies to beam search (beam_width > 1)")

    ids = tensors["input_ids"].reshape(-1).astype(np.int64)
    length = _scalar(tensors, "input_lengths")
    if length is not None:
        _check(1 <= length <= ids.size, f"input_lengths: must be in [1, {ids.size}], got {length}")
        ids = ids[:length]
    _check(ids.size >= 1, "input_ids: the prompt must have at least one token")
    _check(
        bool(((ids >= 0) & (ids < vocab_size)).all()), f"input_ids: token ids must be in [0, {vocab_size})"
    )
    _check(
        ids.size < max_seq_len,
        f"input_ids: the prompt has {ids.size} tokens; this model accepts at most {max_seq_len - 1}",
    )
    max_new = _scalar(tensors, "request_output_len")
    _check(max_new >= 1, f"request_output_len: must be >= 1, got {max_new}")
    _check(
        ids.size + max_new <= max_seq_len,
        f"request_output_len: prompt tokens + request_output_len must be <= {max_seq_len} "
        f"(max_seq_len); got {ids.size} + {max_new}",
    )

    def number(name: str, low: float, high: float, low_open: bool = False) -> float:
        value = float(_scalar(tensors, name))
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
        _check(ok, f"{name}: must be in {'(' if low_open else '['}{low}, {high}], got {value}")
        return value

    streaming = bool(_scalar(tensors, "streaming"))
    params = SamplingParams(
        temperature=number("temperature", 0.0, math.inf),
        top_k=int(number("runtime_top_k", 0, 2**31 - 1)),
        top_p=number("runtime_top_p", 0.0, 1.0),
        typical_p=number("typical_p", 0.0, 1.0, low_open=True),
        repetition_penalty=number("repetition_penalty", 0.0, math.inf, low_open=True),
        presence_penalty=number("presence_penalty", -math.inf, math.inf),
        frequency_penalty=number("frequency_penalty", -math.inf, math.inf),
        min_length=int(number("min_length", 0, 2**31 - 1)),
        no_repeat_ngram_size=int(number("no_repeat_ngram_size", 0, 2**31 - 1)),
        end_id=int(number("end_id", -1, vocab_size - 1)),
        seed=_scalar(tensors, "random_seed"),
        watermark=bool(_scalar(tensors, "watermark")),
        bad_words=parse_word_list(tensors, "bad_words_list", vocab_size),
        return_log_probs=bool(_scalar(tensors, "return_log_probs")),
        num_top_log_probs=int(number("num_top_log_probs", 0, MAX_TOP_LOG_PROBS)),
        return_prompt_log_probs=bool(_scalar(tensors, "return_prompt_log_probs")),
        return_context_logits=bool(_scalar(tensors, "return_context_logits")),
        return_generation_logits=bool(_scalar(tensors, "return_generation_logits")),
    )
    if params.num_top_log_probs or params.return_prompt_log_probs:
        _check(params.return_log_probs, "num_top_log_probs and return_prompt_log_probs need return_log_probs")
    len_penalty = number("len_penalty", -math.inf, math.inf)
    early_stopping = int(_scalar(tensors, "early_stopping"))
    stop_words = parse_word_list(tensors, "stop_words_list", vocab_size)
    stop_strings = strings(tensors, "stop_strings")
    params.stop_token_ids = [w[0] for w in stop_words if len(w) == 1]
    if beam_width > 1:  # what beam search cannot honour is refused, never ignored
        _check(params.greedy, "beam_width: beam search is deterministic; leave temperature/top_k/top_p unset")
        _check(not streaming, "streaming: beam search answers with one final response; set it false")
        _check(not params.return_generation_logits, "return_generation_logits: not with beam search")
        _check(
            all(len(w) == 1 for w in stop_words),
            "stop_words_list: beam search supports single-token stop words only",
        )
        _check(not params.watermark, "watermark: not available with beam search")
        _check(not stop_strings, "stop_strings: beam search stops on single-token stop words only")
    guide = parse_guide(tensors)
    if guide is not None:
        _check(beam_width == 1, "guided_decoding_guide: not available with beam search (beam_width > 1)")
        # The grammar mask covers one token per step; drafts would be verified unconstrained.
        _check("draft_input_ids" not in tensors, "draft_input_ids: not available with guided decoding")
    if "pad_id" in tensors:  # packed batches never pad; still, a bad id is the client's mistake
        number("pad_id", 0, vocab_size - 1)
    if "embedding_bias" in tensors:
        bias = tensors["embedding_bias"].reshape(-1)
        _check(bias.size == vocab_size, f"embedding_bias: expected {vocab_size} values, got {bias.size}")
        params.embedding_bias = torch.from_numpy(bias.astype(np.float32))
    return Request(
        prompt_ids=tuple(ids.tolist()),
        max_new_tokens=max_new,
        params=params,
        streaming=streaming,
        stop_words=tuple(tuple(w) for w in stop_words),
        stop_strings=tuple(dict.fromkeys(stop_strings)),
        beam_width=beam_width,
        len_penalty=len_penalty,
        early_stopping=early_stopping,
        text_wanted=text_wanted,
        skip_special_tokens=bool(_scalar(tensors, "skip_special_tokens")),
        include_stop_str_in_output=bool(_scalar(tensors, "include_stop_str_in_output")),
        guide=guide,
    )


def _text(tensors: dict[str, np.ndarray], name: str) -> str | None:
    if name not in tensors:
        return None
    _check(tensors[name].size == 1, f"{name}: expected one value, got shape {list(tensors[name].shape)}")
    return as_text(tensors[name].reshape(-1)[0], name)


def parse_guide(tensors: dict[str, np.ndarray]) -> Guide | None:
    """The guided-decoding pair (TensorRT-LLM's names). The guide itself is checked when it
    compiles (structured_output.Grammars), off the engine loop."""
    kind, text = _text(tensors, "guided_decoding_guide_type"), _text(tensors, "guided_decoding_guide")
    if kind is None:
        _check(text is None, "guided_decoding_guide: needs guided_decoding_guide_type")
        return None
    _check(
        kind in contract.GUIDE_TYPES,
        f"guided_decoding_guide_type: must be one of {', '.join(contract.GUIDE_TYPES)}, got {kind!r}",
    )
    _check(kind == "json" or bool(text), f"guided_decoding_guide: required with guide type {kind}")
    return Guide(kind, text or "")
