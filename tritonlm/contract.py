"""The tensor contract: the one place that names every tensor the Triton models exchange.

`model_repository/*/config.pbtxt` is generated from these tables (`python -m tritonlm.serving.pbtxt`) and a
unit test checks that the committed files still match. The engine tensors follow TensorRT-LLM's
inference request/response tensors by name, type and shape; extras the JSON APIs need are marked.

Sampling semantics of the engine (TensorRT-LLM's): `runtime_top_k` 0 means no top-k limit,
`runtime_top_p` 0 means no top-p limit, and both 0 (the defaults) or `temperature` 0 mean greedy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Bounds:
    """The values a numeric input accepts: [low, high], or (low, high] when `low_open`. A float
    input must be finite as well, whatever its bounds."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False

    def admit(self, value: float) -> bool:
        return (value > self.low if self.low_open else value >= self.low) and value <= self.high


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # Triton type name without the TYPE_ prefix: INT32, FP32, BOOL, BYTES …
    dims: tuple[int, ...]
    optional: bool = True
    default: object = None  # value used when an optional input is absent (None: absent means "off")
    # The values a numeric input accepts, when they do not depend on the model (token ids do).
    bounds: Bounds | None = None
    # Batched models only: requests whose shapes differ may share an execute call (allow_ragged_batch).
    ragged: bool = False
    # Batched models only: the shape the model sees (Triton's reshape), e.g. () for a [1] input.
    reshape: tuple[int, ...] | None = None
    # Other names the model accepts for this input (TensorRT-LLM's newer names): each is an input of
    # its own in config.pbtxt; the reader takes whichever was given (both: an error).
    aliases: tuple[str, ...] = ()


NUMPY_DTYPES: dict[str, type] = {
    "BOOL": np.bool_,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT64": np.uint64,
    "FP16": np.float16,
    "FP32": np.float32,
    "BYTES": np.object_,
}


# The Triton models of model_repository/.
PREPROCESSING, ENGINE, POSTPROCESSING, ENSEMBLE, EMBEDDING, MULTIMODAL_ENCODER = (
    "preprocessing", "engine", "postprocessing", "ensemble", "embedding", "multimodal_encoder"
)  # fmt: skip
# NVIDIA's names over the ensemble: TensorRT-LLM's LLM-API model, and its BLS model's (the ensemble's
# tensors with a batch dimension; what Triton's OpenAI frontend sends).
LLM_API, TRTLLM_BLS = "tensorrt_llm", "tensorrt_llm_bls"


def _scalar(
    name: str, dtype: str, default: object = None, bounds: Bounds | None = None, aliases: tuple[str, ...] = ()
) -> Tensor:
    return Tensor(name, dtype, (1,), default=default, bounds=bounds, aliases=aliases)


def with_aliases(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """`tensors` and, after them, one optional input per alias (what config.pbtxt declares and
    the model reads; RequestTensors files an alias's value under its tensor's name)."""
    return tensors + tuple(
        Tensor(alias, t.dtype, t.dims, default=t.default, bounds=t.bounds)
        for t in tensors
        for alias in t.aliases
    )


MAX_BEAM_WIDTH = 16
MAX_TOP_LOG_PROBS = 20  # alternatives per token (OpenAI's top_logprobs limit)
_AT_LEAST_0, _AT_LEAST_1 = Bounds(0), Bounds(1)
_PROBABILITY = Bounds(0.0, 1.0)
_POSITIVE_PROBABILITY = Bounds(0.0, 1.0, low_open=True)


# ---------------------------------------------------------------------------------------------
# engine: TensorRT-LLM's request tensors (exact names and types) plus typical_p / watermark.
ENGINE_INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "INT32", (1, -1), optional=False),
    Tensor("request_output_len", "INT32", (1, 1), optional=False, bounds=_AT_LEAST_1),
    _scalar("input_lengths", "INT32"),
    _scalar("streaming", "BOOL", False),
    _scalar("beam_width", "INT32", 1, Bounds(1, MAX_BEAM_WIDTH)),
    _scalar("temperature", "FP32", 1.0, Bounds(0.0)),
    _scalar("runtime_top_k", "INT32", 0, _AT_LEAST_0),
    _scalar("runtime_top_p", "FP32", 0.0, _PROBABILITY),
    _scalar("len_penalty", "FP32", 1.0),
    _scalar("early_stopping", "INT32", 1),
    _scalar("repetition_penalty", "FP32", 1.0, Bounds(0.0, low_open=True)),
    _scalar("min_length", "INT32", 0, _AT_LEAST_0, aliases=("min_tokens",)),
    _scalar("presence_penalty", "FP32", 0.0),
    _scalar("frequency_penalty", "FP32", 0.0),
    _scalar("no_repeat_ngram_size", "INT32", 0, _AT_LEAST_0),
    _scalar("random_seed", "UINT64", aliases=("seed",)),
    _scalar("end_id", "INT32", -1),
    _scalar("pad_id", "INT32"),  # validated only: packed batches never pad, so nothing to fill
    Tensor("embedding_bias", "FP32", (1, -1)),
    Tensor("bad_words_list", "INT32", (2, -1)),
    Tensor("stop_words_list", "INT32", (2, -1)),
    # Extension: texts that end the generation, looked for in the output text across tokens (the
    # HTTP APIs' `stop`; stop_words_list's words are looked for as text too).
    Tensor("stop_strings", "BYTES", (-1,)),
    # P-tuning / prompt tables: input ids >= the model's vocab size select row id - vocab_size of
    # the table ([1, P, hidden]) instead of a token embedding; prompt_vocab_size (default P) bounds them.
    # FP32 whatever the model's dtype (TensorRT-LLM: FP16): exact for every model, so media rows keep
    # transformers' greedy output (FP16 rounding of the tiny Llava's image rows changed it).
    Tensor("prompt_embedding_table", "FP32", (1, -1, -1)),
    _scalar("prompt_vocab_size", "INT32"),
    # LoRA (tritonlm/lora): TensorRT-LLM's task-id cache. lora_weights is FP32 whatever the model's
    # dtype (exact for every model; converted to the model's dtype once, when cached): rows of
    # flatten(A[r, in]) then flatten(B[out, r] * scale), zero-padded; lora_config rows are
    # [module_id, layer_idx, adapter_size] (module ids: tritonlm/lora/format.py).
    _scalar("lora_task_id", "UINT64"),
    Tensor("lora_weights", "FP32", (-1, -1)),
    Tensor("lora_config", "INT32", (-1, 3)),
    # Extension: an adapter loaded at start-up (lora_modules), by name; what the HTTP APIs send.
    _scalar("lora_name", "BYTES"),
    _scalar("return_log_probs", "BOOL", False),
    _scalar("return_context_logits", "BOOL", False),
    _scalar("return_generation_logits", "BOOL", False),
    # TensorRT-LLM's output switches: the outputs of the same names (num_input_tokens,
    # num_output_tokens; with return_perf_metrics the KV-cache and timing outputs) hold a value.
    _scalar("return_num_input_tokens", "BOOL", False),
    _scalar("return_num_output_tokens", "BOOL", False),
    _scalar("return_perf_metrics", "BOOL", False),
    # TensorRT-LLM's: true, the outputs hold the generated tokens alone (what its model guides
    # configure); false, a response that is not streamed starts output_ids with the prompt.
    _scalar("exclude_input_in_output", "BOOL", True),
    # TensorRT-LLM's: how many of the beams come back, best first (absent: all of them). Without
    # beams only 1: a sampled request is one sequence (the HTTP APIs' `n` runs several).
    _scalar("num_return_sequences", "INT32", bounds=Bounds(1, MAX_BEAM_WIDTH)),
    # Draft tokens to verify in the first generation step (up to K + 1 tokens from one step); with
    # draft_logits [K, vocab] a sampled request uses TensorRT-LLM's acceptance rule, with
    # draft_acceptance_threshold in place of its random draw.
    Tensor("draft_input_ids", "INT32", (-1,)),
    Tensor("draft_logits", "FP32", (-1, -1)),
    _scalar("draft_acceptance_threshold", "FP32", bounds=_POSITIVE_PROBABILITY),
    # Extensions (TGI's typical_p and watermark; the seeds call them unsupported, we support them).
    _scalar("typical_p", "FP32", 1.0, _POSITIVE_PROBABILITY),
    _scalar("watermark", "BOOL", False),
    # Extension (vLLM's request priority; TensorRT-LLM's Triton backend has no such input): lower is
    # admitted first under the engine's scheduling_policy priority; other than 0 is refused under fcfs.
    _scalar("priority", "INT32", 0),
    # Extensions for the OpenAI APIs. Alternatives per generated token (0-20, needs return_log_probs):
    _scalar("num_top_log_probs", "INT32", 0, Bounds(0, MAX_TOP_LOG_PROBS)),
    # Log probs (and num_top_log_probs alternatives) of the prompt tokens, for `echo` with logprobs.
    _scalar("return_prompt_log_probs", "BOOL", False),
    # Detokenization settings: the engine only echoes them, for postprocessing (see below).
    _scalar("skip_special_tokens", "BOOL", True),
    _scalar("include_stop_str_in_output", "BOOL", False),
    # Guided decoding, as TensorRT-LLM's Triton backend names it: the guide's kind (one of
    # GUIDE_TYPES) and the guide itself (a JSON schema, a regex, an EBNF grammar, a structural tag).
    _scalar("guided_decoding_guide_type", "BYTES"),
    _scalar("guided_decoding_guide", "BYTES"),
    # Extension: a stream resumed on another replica (the frontend's router). The last N input_ids
    # are this request's own output tokens, already sent to its client: they start the output (they
    # count for request_output_len, min_length, penalties, the guide, stop words and strings, the
    # text), each draw stays the one of its position (random_seed), and only later tokens are sent.
    _scalar("resume_output_len", "INT32", 0, _AT_LEAST_0),
    # Extension (the HTTP frontend sets it): a streamed request's responses between its first and
    # its final one carry only the outputs of their new tokens (PER_TOKEN_OUTPUTS); the first
    # carries the rest too, and the final carries everything, the step timings (STEP_TIMINGS) of all
    # the request's tokens among it. Every output of every response is a copy through the server and
    # a field to parse for the client: per token, that is most of what serving costs on a small model.
    _scalar("compact_stream", "BOOL", False),
)

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "structural_tag")

# What postprocessing makes of the engine's responses. The engine makes them itself when a client
# asks for them (the HTTP frontend does: one hop less per token); the ensemble's engine step never does.
TEXT_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "BYTES", (-1,)),  # per beam: the new text of this response
    # The text of each token of this response decoded alone, special tokens included: beam 0's
    # tokens, then beam 1's, … (each beam's first sequence_length[beam] tokens).
    Tensor("token_texts", "BYTES", (-1,)),
    Tensor("token_special", "BOOL", (-1,)),  # same layout as token_texts
    Tensor("top_token_texts", "BYTES", (-1, -1)),  # the text of each top_ids entry ("" for -1)
    Tensor("prompt_top_token_texts", "BYTES", (-1, -1)),  # the text of each prompt_top_ids entry
    # Per beam, on the final response: the stop string that ended the text, else "".
    Tensor("stop_reason", "BYTES", (-1,)),
)

# TensorRT-LLM's outputs that hold a value ([1]) only when their return_* input asks (else []):
# return_num_input_tokens, return_num_output_tokens (this response's tokens, beam 0's), and
# return_perf_metrics (KV blocks of the prefix cache, monotonic-clock times in ns, draft tokens).
PERF_METRICS: tuple[Tensor, ...] = (
    Tensor("kv_cache_alloc_new_blocks", "INT32", (-1,)),
    Tensor("kv_cache_reused_blocks", "INT32", (-1,)),
    Tensor("kv_cache_alloc_total_blocks", "INT32", (-1,)),
    Tensor("arrival_time_ns", "INT64", (-1,)),
    Tensor("first_scheduled_time_ns", "INT64", (-1,)),
    Tensor("first_token_time_ns", "INT64", (-1,)),
    Tensor("last_token_time_ns", "INT64", (-1,)),
    Tensor("acceptance_rate", "FP32", (-1,)),
    Tensor("total_accepted_draft_tokens", "INT32", (-1,)),
    Tensor("total_draft_tokens", "INT32", (-1,)),
)
REPORTED_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("num_input_tokens", "INT32", (-1,)),
    Tensor("num_output_tokens", "INT32", (-1,)),
    *PERF_METRICS,
)

ENGINE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "INT32", (-1, -1)),
    Tensor("sequence_length", "INT32", (-1,)),
    Tensor("output_log_probs", "FP32", (1, -1, -1)),
    Tensor("cum_log_probs", "FP32", (1, -1)),
    Tensor("context_logits", "FP32", (1, -1, -1)),
    Tensor("generation_logits", "FP32", (1, -1, -1, -1)),
    # Extensions for the JSON APIs.
    Tensor("finish_reason", "BYTES", (-1,)),  # per beam: "" until finished, then FINISH_REASONS
    Tensor("prompt_tokens", "INT32", (1,)),
    Tensor("batch_size", "INT32", (-1,)),  # running sequences in the step that made each token
    Tensor("queue_wait_us", "INT64", (-1,)),  # per token: time between steps spent waiting, µs
    Tensor("prefill_ms", "FP32", (1,)),
    Tensor("decode_ms", "FP32", (-1,)),  # per token: wall time since the previous token, ms
    Tensor("request_key", "UINT64", (1,)),  # unique per request: keys postprocessing's state
    # TensorRT-LLM's: which of a request's num_return_sequences sampled sequences a response is
    # of (0 otherwise); the one answer of a request not streamed holds one per row.
    Tensor("sequence_index", "INT32", (-1,)),
    Tensor("cached_tokens", "INT32", (1,)),  # prompt tokens whose KV came from the prefix cache
    *REPORTED_OUTPUTS,
    # Per token of this response: the num_top_log_probs best alternatives, best first.
    Tensor("top_log_probs", "FP32", (-1, -1)),
    Tensor("top_ids", "INT32", (-1, -1)),
    # With return_prompt_log_probs, in the first response: one entry per prompt token (the first
    # token has no log prob: 0 there, and no alternatives: its row is -inf / -1).
    Tensor("prompt_log_probs", "FP32", (-1,)),
    Tensor("prompt_top_log_probs", "FP32", (-1, -1)),
    Tensor("prompt_top_ids", "INT32", (-1, -1)),
    # Request settings echoed back: a step after a decoupled model may only take inputs from that
    # model, so this is how postprocessing learns which stop strings to cut and hold back, and how
    # to detokenize.
    Tensor("stop_words_list", "INT32", (2, -1)),
    Tensor("stop_strings", "BYTES", (-1,)),
    Tensor("skip_special_tokens", "BOOL", (1,)),
    Tensor("include_stop_str_in_output", "BOOL", (1,)),
    *TEXT_OUTPUTS,
)

# compact_stream: what a response between a stream's first and final ones carries (of what was asked
# for), and what its final one carries for every token instead of for its own.
PER_TOKEN_OUTPUTS = frozenset(
    {"output_ids", "output_log_probs", "cum_log_probs", "generation_logits", "top_log_probs", "top_ids"}
    | {"num_output_tokens", "text_output", "token_texts", "token_special", "top_token_texts"}
)
STEP_TIMINGS = frozenset({"batch_size", "queue_wait_us", "decode_ms"})

FINISH_REASONS = ("length", "end_id", "stop_words", "cancelled")  # "error" fails the request instead

# ---------------------------------------------------------------------------------------------
# preprocessing: text -> engine inputs.
PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    # The prompt: text_input as is, or chat_messages (a JSON list of OpenAI-style messages) rendered
    # with the tokenizer's chat template and its generation prompt; exactly one of them.
    Tensor("text_input", "BYTES", (1,)),
    Tensor("chat_messages", "BYTES", (1,)),
    Tensor("chat_template_kwargs", "BYTES", (1,)),  # JSON object: extra chat template variables
    Tensor("chat_tools", "BYTES", (1,)),  # JSON list of OpenAI tools, for the chat template
    # Absent: as many tokens as fit in the context (max_seq_len minus the prompt).
    Tensor("max_tokens", "INT32", (1,), bounds=_AT_LEAST_1),
    Tensor("bad_words", "BYTES", (-1,)),
    Tensor("stop_words", "BYTES", (-1,)),
    Tensor("stop_token_ids", "INT32", (-1,)),  # each id stops generation (as a one-token stop word)
    # No end token (end_id -1), and the extra EOS ids of generation_config.json do not stop either.
    _scalar("ignore_eos", "BOOL", False),
    _scalar("end_id", "INT32"),
    _scalar("pad_id", "INT32"),
    _scalar("truncate", "INT32", bounds=_AT_LEAST_1),  # keep only the last N prompt tokens (TGI's truncate)
    # Instead of failing when prompt + max_tokens exceed max_seq_len: keep the prompt's last
    # max_seq_len - 1 tokens and lower max_tokens to what fits (Databricks' error_behavior "truncate").
    _scalar("truncate_to_fit", "BOOL", False),
    # P-tuning's virtual prompt: prepend ids vocab_size .. vocab_size + N - 1 (the model's vocab
    # size), i.e. the first N rows of the engine's prompt_embedding_table.
    _scalar("virtual_tokens", "INT32", 0, _AT_LEAST_0),
    # Multimodal models. TGI's list `inputs`: a JSON list of {"type": "text", "text": ...} and
    # {"type": "image" | "video" | "audio"} parts, rendered without a chat template (each media part
    # becomes the processor's placeholder text); instead of text_input and chat_messages.
    Tensor("prompt_parts", "BYTES", (1,)),
    # multimodal_encoder's rows per media item: the k-th placeholder in the prompt becomes
    # media_rows[k] table ids, after the virtual_tokens rows; media_kinds (optional) checks the order.
    Tensor("media_rows", "INT32", (1, -1)),
    Tensor("media_kinds", "BYTES", (1, -1)),
    # TensorRT-LLM's logit bias by word: each word's tokens get its weight added (summed when
    # words share a token); one weight per word.
    Tensor("embedding_bias_words", "BYTES", (-1,)),
    Tensor("embedding_bias_weights", "FP32", (-1,)),
    # Instead of a prompt: token ids to decode (the HTTP frontend's POST /detokenize); the answer is
    # `decoded_text` alone. Not an ensemble input.
    Tensor("token_ids", "INT32", (-1,)),
)

PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "INT32", (1, -1)),
    Tensor("input_lengths", "INT32", (1,)),
    Tensor("request_output_len", "INT32", (1, 1)),
    Tensor("bad_words_list", "INT32", (2, -1)),
    Tensor("stop_words_list", "INT32", (2, -1)),  # stop_token_ids and the extra EOS ids, one each
    Tensor("stop_strings", "BYTES", (-1,)),  # the stop_words, as text
    Tensor("out_end_id", "INT32", (1,)),
    Tensor("out_pad_id", "INT32", (1,)),
    # Not an engine input: read by clients that call preprocessing directly (TGI's prefill details).
    Tensor("input_token_texts", "BYTES", (-1,)),
    # With embedding_bias_words: TensorRT-LLM's [1, vocab] bias (absent otherwise).
    Tensor("embedding_bias", "FP32", (1, -1)),
    # With token_ids: their text, special tokens included (the only output then).
    Tensor("decoded_text", "BYTES", (1,)),
)
# Preprocessing's outputs for clients that call it directly; the ensemble passes them to no step.
PREPROCESSING_CLIENT_OUTPUTS: tuple[str, ...] = ("input_token_texts", "decoded_text")

# ---------------------------------------------------------------------------------------------
# postprocessing: engine responses -> text. Engine outputs listed in PASSTHROUGH go on unchanged.
PASSTHROUGH: tuple[str, ...] = (
    "output_ids",
    "sequence_length",
    "output_log_probs",
    "cum_log_probs",
    "finish_reason",
    "prompt_tokens",
    "batch_size",
    "queue_wait_us",
    "prefill_ms",
    "decode_ms",
    "cached_tokens",
    "sequence_index",
    "top_log_probs",
    "top_ids",
    "prompt_log_probs",
    "prompt_top_log_probs",
    "prompt_top_ids",
    *(t.name for t in REPORTED_OUTPUTS),
)
# Engine outputs postprocessing reads but does not pass on: per-request state and settings.
ENGINE_ECHOES: tuple[str, ...] = (
    "request_key",
    "stop_words_list",
    "stop_strings",
    "skip_special_tokens",
    "include_stop_str_in_output",
)

_ENGINE_OUT = {t.name: t for t in ENGINE_OUTPUTS}

POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    *(
        Tensor(_ENGINE_OUT[n].name, _ENGINE_OUT[n].dtype, _ENGINE_OUT[n].dims, optional=False)
        for n in PASSTHROUGH
    ),
    Tensor("request_key", "UINT64", (1,), optional=False),
    Tensor("stop_words_list", "INT32", (2, -1), optional=False),
    Tensor("stop_strings", "BYTES", (-1,)),
    _scalar("skip_special_tokens", "BOOL", True),
    _scalar("include_stop_str_in_output", "BOOL", False),
)

POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    *TEXT_OUTPUTS,
    *(Tensor(f"out_{n}", _ENGINE_OUT[n].dtype, _ENGINE_OUT[n].dims) for n in PASSTHROUGH),
)

# ---------------------------------------------------------------------------------------------
# multimodal_encoder: media files -> prompt-table rows (tritonlm/multimodal/service.py). Batched
# (dynamic batching; dims leave out the batch dimension, each request is a batch of one): the items
# of the requests gathered in one execute call go through one forward pass per kind; a request
# with a bad item fails alone.
ENCODER_INPUTS: tuple[Tensor, ...] = (
    Tensor("media", "BYTES", (-1,), ragged=True),  # one file's bytes per item ([1, items])
    Tensor("media_kinds", "BYTES", (-1,), ragged=True),  # per item: "image", "video" or "audio"
    # The client's own rows ([1, P, hidden]), passed on first; with media they must be exactly the
    # virtual_tokens rows, because preprocessing numbers the media rows from there.
    Tensor("prompt_embedding_table", "FP32", (-1, -1), ragged=True),
    Tensor("virtual_tokens", "INT32", (1,), reshape=()),
    # Not read: Triton's batcher sizes a request by its inputs, and a text-only request through the
    # ensemble has no media and no table, so the prompt inputs go to the encoder too (whichever the
    # request has) to give it one.
    Tensor("text_input", "BYTES", (1,), reshape=()),
    Tensor("chat_messages", "BYTES", (1,), reshape=()),
    Tensor("prompt_parts", "BYTES", (1,), reshape=()),
)
ENCODER_ANCHORS: tuple[str, ...] = ("text_input", "chat_messages", "prompt_parts")

# Without media, only the client's table (if any) comes back and media_rows is absent.
ENCODER_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("prompt_embedding_table", "FP32", (-1, -1)),  # [1, P, hidden]: client rows, then each item's
    Tensor("media_rows", "INT32", (-1,)),  # [1, items]: rows per item, in order
)
# Requests per execute call (their items share the forward passes).
ENCODER_MAX_BATCH_SIZE = 8
# Where the encoder's outputs go in the ensemble.
ENCODER_OUTPUT_TARGETS: dict[str, str] = {
    "prompt_embedding_table": "engine.prompt_embedding_table",
    "media_rows": "preprocessing.media_rows",
}

# ---------------------------------------------------------------------------------------------
# ensemble: what HTTP frontends and raw-text gRPC clients call: (input, "step.tensor" targets).
# Only preprocessing and engine can take ensemble inputs: Triton feeds the step after a decoupled
# model from that model's outputs alone.
ENSEMBLE_INPUTS: tuple[tuple[Tensor, str], ...] = (
    # The prompt: text_input, chat_messages or prompt_parts.
    (Tensor("text_input", "BYTES", (1,)), "preprocessing.text_input multimodal_encoder.text_input"),
    (Tensor("chat_messages", "BYTES", (1,)), "preprocessing.chat_messages multimodal_encoder.chat_messages"),
    (Tensor("prompt_parts", "BYTES", (1,)), "preprocessing.prompt_parts multimodal_encoder.prompt_parts"),
    # Media items ([1, items]): their rows follow the client's prompt_embedding_table rows.
    (Tensor("media", "BYTES", (1, -1)), "multimodal_encoder.media"),
    (Tensor("media_kinds", "BYTES", (1, -1)), "multimodal_encoder.media_kinds preprocessing.media_kinds"),
    (Tensor("chat_template_kwargs", "BYTES", (1,)), "preprocessing.chat_template_kwargs"),
    (Tensor("chat_tools", "BYTES", (1,)), "preprocessing.chat_tools"),
    (Tensor("max_tokens", "INT32", (1,)), "preprocessing.max_tokens"),
    (Tensor("bad_words", "BYTES", (-1,)), "preprocessing.bad_words"),
    (Tensor("stop_words", "BYTES", (-1,)), "preprocessing.stop_words"),
    (Tensor("stop_token_ids", "INT32", (-1,)), "preprocessing.stop_token_ids"),
    (_scalar("ignore_eos", "BOOL"), "preprocessing.ignore_eos"),
    (_scalar("end_id", "INT32"), "preprocessing.end_id"),
    (_scalar("pad_id", "INT32"), "preprocessing.pad_id"),
    (_scalar("truncate", "INT32"), "preprocessing.truncate"),
    (_scalar("truncate_to_fit", "BOOL"), "preprocessing.truncate_to_fit"),
    (_scalar("stream", "BOOL"), "engine.streaming"),
    (_scalar("lora_task_id", "UINT64"), "engine.lora_task_id"),
    (Tensor("lora_weights", "FP32", (-1, -1)), "engine.lora_weights"),
    (Tensor("lora_config", "INT32", (-1, 3)), "engine.lora_config"),
    (_scalar("lora_name", "BYTES"), "engine.lora_name"),
    (_scalar("beam_width", "INT32"), "engine.beam_width"),
    (_scalar("temperature", "FP32"), "engine.temperature"),
    (_scalar("top_k", "INT32"), "engine.runtime_top_k"),
    (_scalar("top_p", "FP32"), "engine.runtime_top_p"),
    (_scalar("typical_p", "FP32"), "engine.typical_p"),
    (_scalar("length_penalty", "FP32"), "engine.len_penalty"),
    (_scalar("early_stopping", "INT32"), "engine.early_stopping"),
    (_scalar("repetition_penalty", "FP32"), "engine.repetition_penalty"),
    (_scalar("min_length", "INT32"), "engine.min_length"),
    (_scalar("presence_penalty", "FP32"), "engine.presence_penalty"),
    (_scalar("frequency_penalty", "FP32"), "engine.frequency_penalty"),
    (_scalar("no_repeat_ngram_size", "INT32"), "engine.no_repeat_ngram_size"),
    (_scalar("random_seed", "UINT64"), "engine.random_seed"),
    # TensorRT-LLM's ensemble names: `seed` and `min_tokens` are aliases of random_seed and min_length.
    (_scalar("seed", "UINT64"), "engine.seed"),
    (_scalar("min_tokens", "INT32"), "engine.min_tokens"),
    (_scalar("num_return_sequences", "INT32"), "engine.num_return_sequences"),
    (_scalar("exclude_input_in_output", "BOOL"), "engine.exclude_input_in_output"),
    (_scalar("return_num_input_tokens", "BOOL"), "engine.return_num_input_tokens"),
    (_scalar("return_num_output_tokens", "BOOL"), "engine.return_num_output_tokens"),
    (_scalar("return_perf_metrics", "BOOL"), "engine.return_perf_metrics"),
    (Tensor("embedding_bias_words", "BYTES", (-1,)), "preprocessing.embedding_bias_words"),
    (Tensor("embedding_bias_weights", "FP32", (-1,)), "preprocessing.embedding_bias_weights"),
    (_scalar("watermark", "BOOL"), "engine.watermark"),
    (_scalar("priority", "INT32"), "engine.priority"),
    (_scalar("return_log_probs", "BOOL"), "engine.return_log_probs"),
    (_scalar("return_context_logits", "BOOL"), "engine.return_context_logits"),
    (_scalar("return_generation_logits", "BOOL"), "engine.return_generation_logits"),
    (_scalar("top_logprobs", "INT32"), "engine.num_top_log_probs"),
    (_scalar("return_prompt_log_probs", "BOOL"), "engine.return_prompt_log_probs"),
    (_scalar("skip_special_tokens", "BOOL"), "engine.skip_special_tokens"),
    (_scalar("include_stop_str_in_output", "BOOL"), "engine.include_stop_str_in_output"),
    (_scalar("guided_decoding_guide_type", "BYTES"), "engine.guided_decoding_guide_type"),
    (_scalar("guided_decoding_guide", "BYTES"), "engine.guided_decoding_guide"),
    # The client's table reaches the engine through the encoder (which appends the media rows).
    (Tensor("prompt_embedding_table", "FP32", (1, -1, -1)), "multimodal_encoder.prompt_embedding_table"),
    (_scalar("prompt_vocab_size", "INT32"), "engine.prompt_vocab_size"),
    (_scalar("virtual_tokens", "INT32"), "preprocessing.virtual_tokens multimodal_encoder.virtual_tokens"),
    (Tensor("draft_input_ids", "INT32", (-1,)), "engine.draft_input_ids"),
    (Tensor("draft_logits", "FP32", (-1, -1)), "engine.draft_logits"),
    (_scalar("draft_acceptance_threshold", "FP32"), "engine.draft_acceptance_threshold"),
)

# Ensemble outputs: every postprocessing output, without the out_ prefix.
ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = tuple(
    Tensor(t.name.removeprefix("out_"), t.dtype, t.dims) for t in POSTPROCESSING_OUTPUTS
)

# ---------------------------------------------------------------------------------------------
# tensorrt_llm: TensorRT-LLM's LLM-API Triton model (triton_backend/all_models/llmapi/tensorrt_llm),
# its inputs and outputs by name, type and shape, over the ensemble (tritonlm/serving/llm_api.py).
# Each input with the ensemble input it feeds ("" where llm_api.py reads it itself); its default is
# the LLM API's (SamplingParams: max_tokens 32; the Triton model: exclude_input_from_output false).
# An absent sampling setting is the engine's default, as SamplingParams' None is the runtime's.
LLM_API_INPUTS: tuple[tuple[Tensor, str], ...] = (
    (Tensor("text_input", "BYTES", (-1,), optional=False), "text_input"),
    (_scalar("streaming", "BOOL", False), "stream"),
    (_scalar("sampling_param_best_of", "INT32", 1), ""),  # only 1: one sequence per request
    (_scalar("sampling_param_temperature", "FP32", bounds=Bounds(0.0)), "temperature"),
    (_scalar("sampling_param_top_k", "INT32", bounds=_AT_LEAST_0), "top_k"),
    (_scalar("sampling_param_top_p", "FP32", bounds=_PROBABILITY), "top_p"),
    (_scalar("sampling_param_frequency_penalty", "FP32"), "frequency_penalty"),
    (_scalar("sampling_param_presence_penalty", "FP32"), "presence_penalty"),
    (_scalar("sampling_param_max_tokens", "INT32", 32, _AT_LEAST_1), "max_tokens"),
    (Tensor("sampling_param_stop", "BYTES", (-1,)), "stop_words"),
    (_scalar("sampling_param_seed", "UINT64"), "random_seed"),
    (_scalar("sampling_param_exclude_input_from_output", "BOOL", False), "exclude_input_in_output"),
    (_scalar("sampling_param_return_perf_metrics", "BOOL", False), "return_perf_metrics"),
    # Which of the outputs below a response carries besides text_output.
    (_scalar("return_finish_reason", "BOOL", False), ""),
    (_scalar("return_stop_reason", "BOOL", False), ""),
    (_scalar("return_cumulative_logprob", "BOOL", False), "return_log_probs"),
    # Refused when true: cancelling another request by its id (the engine cancels a request
    # whose client goes away, not by id).
    (_scalar("stop", "BOOL", False), ""),
    # LoRA: an adapter loaded at start-up (lora_modules) by lora_name; lora_id and lora_path (an
    # adapter read from a path the client names) are refused, with what to send instead.
    (_scalar("lora_name", "BYTES"), "lora_name"),
    (_scalar("lora_id", "UINT64"), ""),
    (_scalar("lora_path", "BYTES"), ""),
    (_scalar("lora_ckpt_source", "BYTES"), ""),
    (Tensor("image_url", "BYTES", (-1,)), ""),  # refused: media go to the ensemble's `media`
)

LLM_API_OUTPUTS: tuple[Tensor, ...] = (
    # The whole text so far (LLM API's CompletionOutput.text; streamed, each response repeats it).
    Tensor("text_output", "BYTES", (-1,)),
    # return_finish_reason: "stop" (end token or a stop string), "length", "cancelled"; "None"
    # until the last response (LLM API's str(None)).
    Tensor("finish_reason", "BYTES", (-1,)),
    Tensor("stop_reason", "BYTES", (-1,)),  # return_stop_reason: the stop string, else "None"
    Tensor("cumulative_logprob", "FP32", (-1,)),  # return_cumulative_logprob
    # sampling_param_return_perf_metrics: KV blocks of this request (the prompt's blocks reused
    # from the prefix cache, missed, and their ratio) and the request's times (monotonic, ns).
    Tensor("kv_cache_reused_block", "INT32", (-1,)),
    Tensor("kv_cache_missed_block", "INT32", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "INT32", (-1,)),
    Tensor("kv_cache_alloc_total_blocks", "INT32", (-1,)),
    Tensor("kv_cache_hit_rate", "FP32", (-1,)),
    Tensor("arrival_time_ns", "INT64", (1,)),
    Tensor("first_scheduled_time_ns", "INT64", (1,)),
    Tensor("first_token_time_ns", "INT64", (1,)),
    Tensor("last_token_time_ns", "INT64", (1,)),
    Tensor("acceptance_rate", "FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "INT32", (1,)),
    Tensor("total_draft_tokens", "INT32", (1,)),
)

# ---------------------------------------------------------------------------------------------
# embedding: texts -> vectors (tritonlm/embedding/embedder.py). Unlike the models above it is batched
# (max_batch_size > 0, dynamic batching), so the dims here leave out the batch dimension: a request
# is [n, 1] texts and gets [n, dimension] vectors; concurrent requests share one forward pass.
EMBEDDING_INPUTS: tuple[Tensor, ...] = (
    Tensor("text", "BYTES", (1,), optional=False),
    Tensor("instruction", "BYTES", (1,)),  # per text, prepended to it; "" or absent: none
)

EMBEDDING_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("embedding", "FP32", (-1,)),
    Tensor("token_count", "INT32", (1,)),  # tokens embedded, special tokens included, after truncation
)

# Texts per forward pass (Triton's max_batch_size); the frontend splits longer input lists.
EMBEDDING_MAX_BATCH_SIZE = 64


def by_name(tensors: tuple[Tensor, ...]) -> dict[str, Tensor]:
    return {t.name: t for t in tensors}
