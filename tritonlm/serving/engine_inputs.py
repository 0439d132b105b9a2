"""Turns the engine's request tensors (TensorRT-LLM's inference request) into a Request, or a clear
error naming a tensor.

Each group of tensors has its reader below (prompt, sampling, beams, stops, guide, drafts, adapter);
what one group excludes in another (beam search against sampling, streaming, guides and drafts, …)
is decided in `check_combinations` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tritonlm import contract
from tritonlm.contract import Bounds
from tritonlm.engine.beam_group import BeamRoom
from tritonlm.engine.prompt_table import table_embeds
from tritonlm.engine.request import DraftTokens, Guide, PromptEmbeds, Request, recurrent_refusal
from tritonlm.errors import InvalidRequest, prompt_too_long
from tritonlm.lora.adapter import LoraAdapter
from tritonlm.lora.store import LORA_TENSORS, LoraStore
from tritonlm.request_tensors import RequestTensors, check_table_shape
from tritonlm.sampling.params import SamplingParams
from tritonlm.text.tokenization import list_to_words

__all__ = ["InvalidRequest", "parse_request"]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidRequest(message)


@dataclass(frozen=True)
class Prompt:
    ids: np.ndarray  # int64, cut to input_lengths, without the resumed output tokens
    embeds: PromptEmbeds | None
    max_new_tokens: int
    resumed: tuple[int, ...] = ()  # output tokens already sent (resume_output_len)


@dataclass(frozen=True)
class Beams:
    width: int
    len_penalty: float
    early_stopping: int


@dataclass(frozen=True)
class Stops:
    words: list[list[int]]  # stop_words_list's words, token ids
    strings: list[str]


def parse_request(
    tensors: dict[str, np.ndarray],
    vocab_size: int,
    max_seq_len: int,
    text_wanted: bool = False,
    adapters: LoraStore | None = None,
    hidden_size: int | None = None,
    by_priority: bool = False,
    recurrent_state: bool = False,
    beam_room: BeamRoom | None = None,
) -> Request:
    """`text_wanted`: the client asked for text outputs (the engine then makes them as it goes).
    `by_priority`: the engine schedules by priority (scheduling_policy priority), else a request's
    priority must be 0.
    `adapters`: where the request's LoRA adapter comes from; it is acquired last, once everything
    else is valid, and the caller releases it when the request is over.
    `hidden_size`: the model's, which prompt-table rows must have (None: not checked).
    `recurrent_state`: the model keeps a recurrent state per sequence (client drafts refused).
    `beam_room`: the engine's room for a beam search's beams (None: not checked)."""
    reader = RequestTensors(tensors, contract.ENGINE_INPUTS)
    beams = read_beams(reader)
    prompt = read_prompt(reader, vocab_size, max_seq_len, hidden_size)
    params = read_sampling(reader, vocab_size)
    stops = read_stops(reader, vocab_size)
    params.stop_token_ids = [w[0] for w in stops.words if len(w) == 1]
    guide = read_guide(reader)
    draft = read_draft(reader, vocab_size)
    streaming = reader.flag("streaming")
    priority = read_priority(reader, by_priority)
    check_combinations(reader, beams, params, stops, guide, prompt, streaming)
    if recurrent_state:
        why = recurrent_refusal(draft is not None)
        _check(not why, why)
    if beam_room is not None:
        why = beam_room.refusal(beams.width, prompt.ids.size + len(prompt.resumed), prompt.max_new_tokens)
        _check(not why, why)
    lora = acquire_adapter(tensors, adapters)  # last: a request refused after it would hold it
    return Request(
        lora=lora,
        prompt_ids=tuple(prompt.ids.tolist()),
        resumed_ids=prompt.resumed,
        max_new_tokens=prompt.max_new_tokens,
        params=params,
        streaming=streaming,
        compact_stream=reader.flag("compact_stream"),
        stop_words=tuple(tuple(w) for w in stops.words),
        stop_strings=tuple(dict.fromkeys(stops.strings)),
        beam_width=beams.width,
        len_penalty=beams.len_penalty,
        early_stopping=beams.early_stopping,
        text_wanted=text_wanted,
        skip_special_tokens=reader.flag("skip_special_tokens"),
        include_stop_str_in_output=reader.flag("include_stop_str_in_output"),
        guide=guide,
        prompt_embeds=prompt.embeds,
        draft=draft,
        priority=priority,
        reports=read_reports(reader),
        num_return_sequences=reader.integer("num_return_sequences"),
        # TensorRT-LLM's rule: streamed responses hold their new tokens alone, whatever the flag.
        echo_prompt=not reader.flag("exclude_input_in_output") and not streaming,
    )


def check_combinations(
    reader: RequestTensors,
    beams: Beams,
    params: SamplingParams,
    stops: Stops,
    guide: Guide | None,
    prompt: Prompt,
    streaming: bool,
) -> None:
    """The rules that span groups of tensors: what one setting excludes is refused, never ignored."""
    _check(streaming or not reader.flag("compact_stream"), "compact_stream: only for a streaming request")
    if params.num_top_log_probs or params.return_prompt_log_probs:
        _check(params.return_log_probs, "num_top_log_probs and return_prompt_log_probs need return_log_probs")
    if prompt.embeds is not None:  # table ids are no tokens: they have no log probs
        _check(not params.return_prompt_log_probs, "return_prompt_log_probs: not with prompt_embedding_table")
    if beams.width == 1:  # beam search settings: meaningless without beams
        for name, value in (("len_penalty", beams.len_penalty), ("early_stopping", beams.early_stopping)):
            unset = value == reader.declared[name].default
            _check(unset, f"{name}: only applies to beam search (beam_width > 1)")
    else:
        _check(params.greedy, "beam_width: beam search is deterministic; leave temperature/top_k/top_p unset")
        _check(not streaming, "streaming: beam search answers with one final response; set it false")
        _check(not params.return_generation_logits, "return_generation_logits: not with beam search")
        _check(
            all(len(w) == 1 for w in stops.words),
            "stop_words_list: beam search supports single-token stop words only",
        )
        _check(not params.watermark, "watermark: not available with beam search")
        _check(not stops.strings, "stop_strings: beam search stops on single-token stop words only")
        _check(guide is None, "guided_decoding_guide: not available with beam search (beam_width > 1)")
        _check("draft_input_ids" not in reader, "draft_input_ids: not with beam search (beam_width > 1)")
    if prompt.embeds is not None:  # table ids are no tokens: they have no text to echo
        _check(
            reader.flag("exclude_input_in_output"),
            "exclude_input_in_output: false is not available with prompt_embedding_table",
        )
    sequences = reader.integer("num_return_sequences")  # without beams: that many sampled sequences
    if sequences is not None and beams.width > 1:
        _check(
            sequences <= beams.width,
            f"num_return_sequences: must be <= beam_width ({beams.width}), got {sequences}",
        )
    if prompt.resumed:  # a beam search answers once, at the end: it never has tokens to resume from
        _check(beams.width == 1, "resume_output_len: a beam search cannot be resumed (beam_width > 1)")
        _check("draft_input_ids" not in reader, "resume_output_len: not with draft_input_ids")
        _check(
            reader.flag("exclude_input_in_output"),
            "resume_output_len: not with exclude_input_in_output false",
        )
        _check(
            sequences in (None, 1),
            "resume_output_len: a resumed stream is one sequence (num_return_sequences)",
        )
    if guide is not None:  # the grammar masks one token per step; drafts would be verified unconstrained
        _check("draft_input_ids" not in reader, "draft_input_ids: not available with guided decoding")


# The return_* switches of TensorRT-LLM's optional outputs, and what each asks the response for.
REPORT_SWITCHES = {
    "return_num_input_tokens": "num_input_tokens",
    "return_num_output_tokens": "num_output_tokens",
    "return_perf_metrics": "perf_metrics",
}


def read_reports(reader: RequestTensors) -> frozenset[str]:
    return frozenset(report for switch, report in REPORT_SWITCHES.items() if reader.flag(switch))


def read_beams(reader: RequestTensors) -> Beams:
    return Beams(
        width=reader.integer("beam_width"),
        len_penalty=reader.number("len_penalty"),
        early_stopping=reader.integer("early_stopping"),
    )


def read_prompt(reader: RequestTensors, vocab_size: int, max_seq_len: int, hidden_size: int | None) -> Prompt:
    """`input_ids` cut to `input_lengths`, its prompt-table rows, `request_output_len`, and the
    resumed output tokens at its end (`resume_output_len`)."""
    ids = reader.array("input_ids").reshape(-1).astype(np.int64)
    length = reader.integer("input_lengths", Bounds(1, ids.size))
    if length is not None:
        ids = ids[:length]
    _check(ids.size >= 1, "input_ids: the prompt must have at least one token")
    embeds = read_prompt_table(reader, ids, vocab_size, hidden_size)
    if ids.size >= max_seq_len:
        raise prompt_too_long(ids.size, max_seq_len)
    max_new = reader.integer("request_output_len")
    resumed = read_resumed(reader, ids, vocab_size, max_new)
    prompt = ids[: ids.size - len(resumed)]
    _check(
        prompt.size + max_new <= max_seq_len,
        f"request_output_len: prompt tokens + request_output_len must be <= {max_seq_len} "
        f"(max_seq_len); got {prompt.size} + {max_new}",
    )
    return Prompt(prompt, embeds, max_new, resumed)


def read_resumed(reader: RequestTensors, ids: np.ndarray, vocab_size: int, max_new: int) -> tuple[int, ...]:
    """The last `resume_output_len` input ids: output tokens, after a prompt of one token at least,
    with at least one token left to make."""
    count = reader.integer("resume_output_len", Bounds(0, ids.size - 1))
    if not count:
        return ()
    _check(
        count < max_new,
        f"resume_output_len: must be less than request_output_len ({max_new}), got {count}",
    )
    resumed = ids[ids.size - count :]
    _check(
        bool(((resumed >= 0) & (resumed < vocab_size)).all()),
        f"resume_output_len: the resumed output tokens must be token ids in [0, {vocab_size})",
    )
    return tuple(resumed.tolist())


def read_prompt_table(
    reader: RequestTensors, ids: np.ndarray, vocab_size: int, hidden_size: int | None
) -> PromptEmbeds | None:
    """`prompt_embedding_table` [1, P, hidden] and `prompt_vocab_size`: the prompt's ids >= vocab_size
    select rows of the table (TensorRT-LLM's p-tuning convention); other ids must be tokens."""
    table = reader.array("prompt_embedding_table")
    if table is None:
        _check("prompt_vocab_size" not in reader, "prompt_vocab_size: needs prompt_embedding_table")
        _check(
            bool(((ids >= 0) & (ids < vocab_size)).all()),
            f"input_ids: token ids must be in [0, {vocab_size})",
        )
        return None
    check_table_shape(table, hidden_size)
    rows = table.shape[1]
    _check(bool(np.isfinite(table).all()), "prompt_embedding_table: values must be finite")
    size = reader.integer("prompt_vocab_size", Bounds(1, rows))  # the table's rows
    size = rows if size is None else size
    _check(
        bool(((ids >= 0) & (ids < vocab_size + size)).all()),
        f"input_ids: must be token ids in [0, {vocab_size}) or prompt-table ids in "
        f"[{vocab_size}, {vocab_size + size}) (vocab size + prompt_vocab_size)",
    )
    return table_embeds(ids, torch.from_numpy(np.ascontiguousarray(table[0])), vocab_size)


def read_sampling(reader: RequestTensors, vocab_size: int) -> SamplingParams:
    """The sampling settings, each within its bounds; `pad_id` is only checked (packed batches
    never pad, but a bad id is still the client's mistake)."""
    reader.integer("pad_id", Bounds(0, vocab_size - 1))
    params = SamplingParams(
        temperature=reader.number("temperature"),
        top_k=reader.integer("runtime_top_k"),
        top_p=reader.number("runtime_top_p"),
        typical_p=reader.number("typical_p"),
        repetition_penalty=reader.number("repetition_penalty"),
        presence_penalty=reader.number("presence_penalty"),
        frequency_penalty=reader.number("frequency_penalty"),
        min_length=reader.integer("min_length"),
        no_repeat_ngram_size=reader.integer("no_repeat_ngram_size"),
        end_id=reader.integer("end_id", Bounds(-1, vocab_size - 1)),
        seed=reader.value("random_seed"),
        watermark=reader.flag("watermark"),
        bad_words=read_word_list(reader, "bad_words_list", vocab_size),
        return_log_probs=reader.flag("return_log_probs"),
        num_top_log_probs=reader.integer("num_top_log_probs"),
        return_prompt_log_probs=reader.flag("return_prompt_log_probs"),
        return_context_logits=reader.flag("return_context_logits"),
        return_generation_logits=reader.flag("return_generation_logits"),
    )
    bias = reader.array("embedding_bias")
    if bias is not None:
        bias = bias.reshape(-1)
        _check(bias.size == vocab_size, f"embedding_bias: expected {vocab_size} values, got {bias.size}")
        params.embedding_bias = torch.from_numpy(bias.astype(np.float32))
    return params


def read_word_list(reader: RequestTensors, name: str, vocab_size: int) -> list[list[int]]:
    """TensorRT-LLM's [2, N] format: row 0 concatenated ids, row 1 end offsets padded with -1."""
    arr = reader.array(name)
    if arr is None:
        return []
    try:
        words = list_to_words(arr)
    except ValueError as error:
        raise InvalidRequest(f"{name}: {error}") from None
    _check(
        all(0 <= t < vocab_size for w in words for t in w), f"{name}: token ids must be in [0, {vocab_size})"
    )
    return words


def read_stops(reader: RequestTensors, vocab_size: int) -> Stops:
    return Stops(read_word_list(reader, "stop_words_list", vocab_size), reader.texts("stop_strings"))


def read_guide(reader: RequestTensors) -> Guide | None:
    """The guided-decoding pair (TensorRT-LLM's names). The guide itself is checked when it
    compiles (structured_output.Grammars), off the engine loop."""
    kind, text = reader.text("guided_decoding_guide_type"), reader.text("guided_decoding_guide")
    if kind is None:
        _check(text is None, "guided_decoding_guide: needs guided_decoding_guide_type")
        return None
    _check(
        kind in contract.GUIDE_TYPES,
        f"guided_decoding_guide_type: must be one of {', '.join(contract.GUIDE_TYPES)}, got {kind!r}",
    )
    _check(kind == "json" or bool(text), f"guided_decoding_guide: required with guide type {kind}")
    return Guide(kind, text or "")


def read_draft(reader: RequestTensors, vocab_size: int) -> DraftTokens | None:
    """`draft_input_ids` [K], `draft_logits` [K, vocab] and `draft_acceptance_threshold`."""
    ids = reader.array("draft_input_ids")
    if ids is None:
        for name in ("draft_logits", "draft_acceptance_threshold"):
            _check(name not in reader, f"{name}: needs draft_input_ids")
        return None
    ids = ids.reshape(-1).astype(np.int64)
    _check(
        bool(((ids >= 0) & (ids < vocab_size)).all()),
        f"draft_input_ids: token ids must be in [0, {vocab_size})",
    )
    probs = None
    logits = reader.array("draft_logits")
    if logits is not None:
        _check(
            logits.shape == (ids.size, vocab_size),
            f"draft_logits: expected shape [{ids.size}, {vocab_size}] (draft tokens, vocab size), "
            f"got {list(logits.shape)}",
        )
        _check(not bool(np.isnan(logits).any()), "draft_logits: values must not be NaN")
        probs = torch.from_numpy(logits.astype(np.float32)).softmax(dim=-1)
    threshold = reader.number("draft_acceptance_threshold")
    if threshold is not None:
        _check(probs is not None, "draft_acceptance_threshold: needs draft_logits")
    return DraftTokens(tuple(ids.tolist()), probs, threshold) if ids.size else None


def read_priority(reader: RequestTensors, by_priority: bool) -> int:
    """`priority` (vLLM's: lower first); refused unless 0 where the engine does not schedule by it,
    as vLLM refuses it, rather than accepted and ignored."""
    priority = reader.integer("priority")
    _check(
        by_priority or priority == 0,
        f"priority: only allowed with the engine's scheduling_policy priority (this engine's is fcfs); "
        f"leave it unset or 0, got {priority}",
    )
    return priority


def acquire_adapter(tensors: dict[str, np.ndarray], adapters: LoraStore | None) -> LoraAdapter | None:
    """The request's LoRA adapter, held until the caller releases it; refused where none are served."""
    if adapters is not None:
        return adapters.acquire(tensors)
    given = [n for n in LORA_TENSORS if n in tensors]
    _check(not given, f"{', '.join(given)}: this engine serves no LoRA adapters")
    return None
