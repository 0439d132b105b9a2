"""Preprocessing, Triton-free: one request's text inputs -> the engine's token inputs (numpy in and out).

A prompt is `text_input`, `chat_messages` rendered with the tokenizer's chat template, or
`prompt_parts` (TGI's list of text and media parts, rendered without a template). On a multimodal
model each media item's placeholder token becomes its `media_rows` table ids (TensorRT-LLM's
multimodal convention: the engine reads those positions from the prompt table). The
`stop_words` strings stay text (`stop_strings`: the engine looks for them in the output text); the
`stop_token_ids` and, unless `ignore_eos`, the extra EOS ids of generation_config.json (a chat
model's end-of-turn token) become one-token words of `stop_words_list`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import numpy as np

from tritonlm import contract
from tritonlm.contract import Bounds
from tritonlm.errors import InvalidRequest, prompt_too_long
from tritonlm.multimodal.architectures import Placeholder
from tritonlm.multimodal.placeholders import expand_media
from tritonlm.request_tensors import RequestTensors, as_text, required
from tritonlm.text import chat_format
from tritonlm.text.tokenization import encode_prompt, ids_to_list, render_chat, token_texts, words_to_list

_OUT = contract.by_name(contract.PREPROCESSING_OUTPUTS)


def _array(name: str, value: Any) -> np.ndarray:
    """An output tensor in the contract's dtype."""
    return np.asarray(value, dtype=contract.NUMPY_DTYPES[_OUT[name].dtype])


# Arguments of apply_chat_template itself; as template variables they would change how it runs.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
        "continue_final_message", "tokenize", "padding", "truncation", "max_length",
        "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    }
)  # fmt: skip
_ROLES = ("system", "user", "assistant", "tool")


def _message_text(content: Any, where: str, media_kinds: tuple[str, ...] = ()) -> str | list | None:
    """A message's content for the template: a list of text parts is joined with newlines (what
    text-only chat templates expect); a list with media parts ({"type": kind}, a kind the model
    takes) stays a list, for a multimodal model's template to put the placeholders in."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of content parts")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in media_kinds:
            continue
        if kind != "text" or not isinstance(part.get("text"), str):
            if media_kinds:
                raise InvalidRequest(
                    f"{where}.content[{i}]: content parts must be text or {', '.join(media_kinds)} "
                    f"for this model, got type {kind!r}"
                )
            raise InvalidRequest(
                f"{where}.content[{i}]: this model is text-only; content parts must be "
                f'{{"type": "text", "text": "..."}}, got type {kind!r}'
            )
        texts.append(part["text"])
    if len(texts) < len(content):
        return content
    return "\n".join(texts)


def chat_messages(value: Any, media_kinds: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The messages for the chat template, checked for what every template relies on; content
    parts of `media_kinds` (the model's) are kept for the template."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest("chat_messages must be a non-empty JSON list of messages")
    messages = []
    for i, message in enumerate(value):
        where = f"chat_messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where} must be a JSON object")
        if message.get("role") not in _ROLES:
            raise InvalidRequest(f"{where}.role must be one of {', '.join(_ROLES)}")
        messages.append({**message, "content": _message_text(message.get("content"), where, media_kinds)})
    return messages


def render_parts(value: Any, placeholders: Mapping[str, Placeholder]) -> str:
    """TGI's list `inputs` as one prompt, without a chat template: the texts in order, each media
    part replaced by its kind's placeholder text (the processor's own)."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest("prompt_parts must be a non-empty JSON list of parts")
    pieces = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind in placeholders:
            pieces.append(placeholders[kind].text)
        else:
            allowed = ", ".join(["text", *placeholders])
            raise InvalidRequest(f"prompt_parts[{i}]: expected a part of type {allowed}, got {kind!r}")
    return "".join(pieces)


class Preprocessor:
    """Validates and tokenizes requests for one tokenizer.

    `placeholders`: a multimodal model's media kinds and their placeholders (none: text-only).
    `max_seq_len`: the engine's limit on prompt + new tokens (None: unknown, then `max_tokens` is
    required and the engine alone checks the limit). `extra_eos_ids`: generation_config.json's EOS
    ids; those other than the tokenizer's EOS stop generation unless `ignore_eos`.
    """

    def __init__(
        self,
        tokenizer: Any,
        max_seq_len: int | None = None,
        extra_eos_ids: Sequence[int] = (),
        model_vocab_size: int | None = None,
        placeholders: Mapping[str, Placeholder] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        # The model's vocab size (config.json), where prompt-table ids start (`virtual_tokens`).
        self.model_vocab_size = model_vocab_size or self.vocab_size
        self.max_seq_len = max_seq_len
        # A multimodal model's media: kind -> placeholder, and the placeholder token ids -> kind.
        self.placeholders = dict(placeholders or {})
        self.media_kinds = tuple(self.placeholders)
        self.placeholder_kinds = {
            int(tokenizer.convert_tokens_to_ids(p.token)): kind for kind, p in self.placeholders.items()
        }
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.default_end_id = -1 if eos is None else int(eos)  # -1: the engine stops on length only
        self.default_pad_id = int(pad) if pad is not None else max(self.default_end_id, 0)
        self.extra_eos_ids = [
            int(i)
            for i in dict.fromkeys(extra_eos_ids)
            if i != self.default_end_id and 0 <= i < self.vocab_size
        ]

    def process(self, inputs: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
        """One request's inputs (contract.PREPROCESSING_INPUTS) -> contract.PREPROCESSING_OUTPUTS.

        Raises InvalidRequest for a client error.
        """
        tensors = RequestTensors(inputs, contract.PREPROCESSING_INPUTS)
        if "token_ids" in tensors:
            return self._decode(tensors)
        # P-tuning's virtual prompt: the first rows of the engine's prompt_embedding_table.
        virtual = tensors.integer("virtual_tokens")
        ids = [self.model_vocab_size + i for i in range(virtual)] + self._prompt_ids(tensors, virtual)
        max_tokens = tensors.integer("max_tokens")
        end_id = tensors.integer("end_id", Bounds(-1, self.vocab_size - 1))
        pad_id = tensors.integer("pad_id", Bounds(0, self.vocab_size - 1))
        ignore_eos = tensors.flag("ignore_eos")
        ids, max_tokens = self._fit(ids, max_tokens, tensors.flag("truncate_to_fit"))

        stop_ids = self._stop_token_ids(tensors)
        if not ignore_eos:
            stop_ids += [i for i in self.extra_eos_ids if i not in stop_ids]
        if ignore_eos:
            end_id = -1
        elif end_id is None:
            end_id = self.default_end_id
        bias = self._embedding_bias(tensors)
        return {
            **({} if bias is None else {"embedding_bias": _array("embedding_bias", bias)}),
            "input_ids": _array("input_ids", [ids]),
            "input_lengths": _array("input_lengths", [len(ids)]),
            "request_output_len": _array("request_output_len", [[max_tokens]]),
            "bad_words_list": words_to_list(self.tokenizer, tensors.texts("bad_words")),
            "stop_words_list": ids_to_list([[i] for i in stop_ids]),
            "stop_strings": _array("stop_strings", [w.encode("utf-8") for w in tensors.texts("stop_words")]),
            "out_end_id": _array("out_end_id", [end_id]),
            "out_pad_id": _array("out_pad_id", [self.default_pad_id if pad_id is None else pad_id]),
            "input_token_texts": _array(
                "input_token_texts", [t.encode("utf-8") for t in self._token_texts(ids)]
            ),
        }

    def _decode(self, tensors: RequestTensors) -> dict[str, np.ndarray]:
        """`token_ids` decoded as they are (special tokens kept), and nothing else asked with them."""
        others = [name for name in tensors.tensors if name != "token_ids"]
        if others:
            raise InvalidRequest(f"token_ids: decoded alone, not with {', '.join(sorted(others))}")
        ids = tensors.array("token_ids").reshape(-1).astype(np.int64)
        if not ((ids >= 0) & (ids < self.vocab_size)).all():
            raise InvalidRequest(f"token_ids: must be token ids in [0, {self.vocab_size})")
        text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=False)
        return {"decoded_text": _array("decoded_text", [text.encode("utf-8")])}

    def _embedding_bias(self, tensors: RequestTensors) -> np.ndarray | None:
        """TensorRT-LLM's `embedding_bias_words` / `embedding_bias_weights` as the engine's [1, vocab]
        bias: each word's tokens get its weight; None when no word has tokens."""
        words, weights = tensors.array("embedding_bias_words"), tensors.array("embedding_bias_weights")
        if words is None and weights is None:
            return None
        words = [] if words is None else [as_text(w, "embedding_bias_words") for w in words.reshape(-1)]
        weights = np.zeros(0) if weights is None else weights.reshape(-1).astype(np.float32)
        if len(words) != weights.size:
            raise InvalidRequest(
                f"embedding_bias_weights: one weight per word of embedding_bias_words; got {weights.size} "
                f"for {len(words)} words"
            )
        if not np.isfinite(weights).all():
            raise InvalidRequest("embedding_bias_weights: values must be finite")
        bias = np.zeros((1, self.model_vocab_size), dtype=np.float32)
        for word, weight in zip(words, weights, strict=True):
            for token in self.tokenizer.encode(word, add_special_tokens=False) if word else ():
                bias[0, token] += weight
        return bias if bias.any() else None

    def _token_texts(self, ids: list[int]) -> list[str]:
        """Each prompt token's text; "" for a virtual token (a prompt-table row, no text)."""
        texts = token_texts(self.tokenizer, [i if i < self.vocab_size else 0 for i in ids])
        return [t if i < self.vocab_size else "" for i, t in zip(ids, texts, strict=True)]

    def _prompt_ids(self, tensors: RequestTensors, virtual: int = 0) -> list[int]:
        """The prompt's token ids, media placeholders expanded (table ids numbered after the
        `virtual` rows); none when only virtual tokens are given (embeddings alone)."""
        text = tensors.text("text_input")
        messages = tensors.json("chat_messages")
        parts = tensors.json("prompt_parts")
        truncate = tensors.integer("truncate")
        prompts = {"text_input": text, "chat_messages": messages, "prompt_parts": parts}
        given = [name for name, value in prompts.items() if value is not None]
        if len(given) > 1:
            raise InvalidRequest(
                f"give one of text_input, chat_messages and prompt_parts, not both {given[0]} and {given[1]}"
            )
        if messages is not None:
            ids = encode_prompt(self.tokenizer, self._render(tensors, messages), add_special_tokens=False)
            name = "chat_messages"
        elif parts is not None:
            ids = encode_prompt(self.tokenizer, render_parts(parts, self.placeholders))
            name = "prompt_parts"
        else:
            if text is None and virtual:
                return []
            if text is None:
                raise InvalidRequest(
                    "text_input is required (or chat_messages, prompt_parts, or virtual_tokens)"
                )
            if not text:
                raise InvalidRequest("text_input must not be empty")
            ids = encode_prompt(self.tokenizer, text)
            name = "text_input"
        if not ids:
            raise InvalidRequest(f"{name} must encode to at least 1 token")
        ids = self._expand_media(tensors, ids, name, self.model_vocab_size + virtual)
        if truncate is not None and len(ids) > truncate:
            # TGI's truncate keeps the prompt's end; cutting into an item's rows would feed half of it.
            if any(i >= self.model_vocab_size for i in ids[: len(ids) - truncate]):
                raise InvalidRequest(f"truncate: keeping the last {truncate} tokens would cut a media item")
            ids = ids[len(ids) - truncate :]
        return ids

    def _expand_media(self, tensors: RequestTensors, ids: list[int], name: str, first_id: int) -> list[int]:
        """Each media item's placeholder token -> its media_rows[k] table ids, from `first_id` on."""
        rows_in = tensors.array("media_rows")
        rows = [] if rows_in is None else [int(r) for r in rows_in.reshape(-1)]
        kinds = tensors.texts("media_kinds") if "media_kinds" in tensors else None
        if not self.placeholders:
            if rows:
                raise InvalidRequest("media_rows: this model is text-only; it takes no media")
            return ids
        if any(r < 1 for r in rows):
            raise InvalidRequest(f"media_rows must be >= 1 per item, got {rows}")
        if kinds is not None and len(kinds) != len(rows):
            raise InvalidRequest(f"media_kinds has {len(kinds)} entries for {len(rows)} media_rows")
        try:
            return expand_media(ids, self.placeholder_kinds, rows, first_id, kinds)
        except ValueError as error:
            raise InvalidRequest(f"{name}: {error}") from None

    def _render(self, tensors: RequestTensors, value: Any) -> str:
        messages = chat_messages(value, self.media_kinds)
        kwargs = tensors.json("chat_template_kwargs")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise InvalidRequest("chat_template_kwargs must be a JSON object")
        if reserved := sorted(_RESERVED_TEMPLATE_KWARGS & kwargs.keys()):
            raise InvalidRequest(f"chat_template_kwargs: {', '.join(reserved)} cannot be set here")
        tools = tensors.json("chat_tools")
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise InvalidRequest("chat_tools must be a JSON list of tool objects")
        messages = chat_format.arguments_as_objects(messages)
        if not chat_format.supports_tools(self.tokenizer.chat_template):
            messages, tools = chat_format.with_tools_in_messages(messages, tools or []), None
        try:
            return render_chat(self.tokenizer, messages, kwargs, tools or None)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
            raise InvalidRequest(f"chat_messages: the model's chat template rejected them: {e}") from None

    def _fit(self, ids: list[int], max_tokens: int | None, truncate_to_fit: bool) -> tuple[list[int], int]:
        """The prompt and max_tokens the engine gets. Without truncate_to_fit an explicit max_tokens
        is left for the engine to check (its message names request_output_len)."""
        limit = self.max_seq_len
        if limit is None:
            if max_tokens is None:
                raise required("max_tokens")
            return ids, max_tokens
        if len(ids) >= limit:
            if not truncate_to_fit:
                raise prompt_too_long(len(ids), limit)
            if any(i >= self.model_vocab_size for i in ids[: len(ids) - (limit - 1)]):
                raise InvalidRequest(
                    f"input_ids: the prompt has {len(ids)} tokens, over {limit - 1}, and cutting it to fit "
                    "would cut its media or virtual tokens"
                )
            ids = ids[len(ids) - (limit - 1) :]
        room = limit - len(ids)
        if max_tokens is None or (truncate_to_fit and max_tokens > room):
            max_tokens = room
        return ids, max_tokens

    def _stop_token_ids(self, tensors: RequestTensors) -> list[int]:
        arr = tensors.array("stop_token_ids")
        if arr is None:
            return []
        ids = [int(i) for i in arr.reshape(-1)]
        if bad := [i for i in ids if not 0 <= i < self.vocab_size]:
            raise InvalidRequest(
                f"stop_token_ids must be token ids in [0, {self.vocab_size - 1}], got {bad[0]}"
            )
        return list(dict.fromkeys(ids))
