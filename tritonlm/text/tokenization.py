"""Tokenizer loading and the token-id formats the engine expects (TensorRT-LLM's)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer


def load_tokenizer(model_dir: str | Path) -> Any:
    """The model's tokenizer from its own directory; never reaches a model hub."""
    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def encode_prompt(
    tokenizer: Any, text: str, truncate: int | None = None, add_special_tokens: bool = True
) -> list[int]:
    """Prompt ids with the tokenizer's own special tokens (a BOS where it is configured to add one);
    a rendered chat template already has them, hence `add_special_tokens=False` for chats.

    `truncate` keeps the last N ids, as TGI does: the end of a prompt matters most to the reply.
    """
    ids = list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    if truncate is not None and len(ids) > truncate:
        ids = ids[len(ids) - truncate :]
    return ids


def render_chat(
    tokenizer: Any, messages: list[dict], template_kwargs: dict[str, Any], tools: list[dict] | None = None
) -> str:
    """The prompt text of a conversation: the tokenizer's chat template with the generation prompt
    (the start of the assistant's turn); `template_kwargs` become extra template variables
    (e.g. `enable_thinking`); `tools` the OpenAI tool list the template may render. Raises jinja2's
    TemplateError (or TypeError …) for messages the template rejects, ValueError when the
    tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template; send a plain prompt instead")
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, **template_kwargs
    )


def generation_eos_ids(model_dir: str | Path) -> list[int]:
    """The EOS ids of the checkpoint's generation_config.json (a list for chat models such as Qwen,
    whose turns end with <|im_end|>); [] when there is none."""
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(i) for i in (eos if isinstance(eos, list) else [eos])]


def words_to_list(tokenizer: Any, words: Sequence[str]) -> np.ndarray:
    """Words as TensorRT-LLM's `[2, N]` int32 word list (bad_words_list / stop_words_list).

    Row 0 holds the concatenated ids of every word, row 1 the cumulative end offset of each word,
    padded with -1 to length N: ["a b", "c"] with ids [[1, 2], [3]] gives [[1, 2, 3], [2, 3, -1]].
    Words that encode to no ids are left out; no words give shape [2, 0].
    """
    ids = [tokenizer.encode(w, add_special_tokens=False) for w in words]
    return ids_to_list([w for w in ids if w])


def ids_to_list(words: Sequence[Sequence[int]]) -> np.ndarray:
    """The `[2, N]` word-list format of already tokenized words (see `words_to_list`)."""
    flat = [int(i) for word in words for i in word]
    offsets = np.cumsum([len(word) for word in words], dtype=np.int64).tolist() if words else []
    out = np.full((2, len(flat)), -1, dtype=np.int32)
    out[0] = flat
    out[1, : len(offsets)] = offsets
    return out


def list_to_words(arr: np.ndarray) -> list[list[int]]:
    """Inverse of `ids_to_list`: the token ids of each word. Accepts a leading batch dim of 1."""
    arr = np.asarray(arr)
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise ValueError(f"word list must have shape [2, N], got {list(arr.shape)}")
    flat, offsets = arr[0].tolist(), arr[1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if end <= start or end > len(flat):
            raise ValueError(f"word list offsets must increase within [1, {len(flat)}], got {offsets}")
        words.append(flat[start:end])
        start = end
    return words


def special_ids(tokenizer: Any) -> frozenset[int]:
    """Every id the tokenizer treats as special (transformers' list and the backend's own)."""
    ids = set(tokenizer.all_special_ids)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "get_added_tokens_decoder"):
        ids.update(i for i, tok in backend.get_added_tokens_decoder().items() if tok.special)
    return frozenset(ids)


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text of each token decoded alone, special tokens included (for per-token details)."""
    singles = [[int(i)] for i in ids]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return list(backend.decode_batch(singles, skip_special_tokens=False))  # one call for a long prompt
    return [tokenizer.decode(s, skip_special_tokens=False) for s in singles]
