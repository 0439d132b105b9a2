"""TensorRT-LLM's multimodal prompt convention: each media item's placeholder token becomes as many
positions as the item has feature rows, with ids >= vocab_size that select rows of the prompt
embedding table (row = id - vocab_size), in the order the items appear."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np


def expand_media(
    ids: list[int],
    placeholder_kinds: Mapping[int, str],
    rows_per_item: Sequence[int],
    first_id: int,
    kinds: Sequence[str] | None = None,
) -> list[int]:
    """`ids` with the k-th placeholder token (any id of `placeholder_kinds`: id -> media kind)
    replaced by rows_per_item[k] table ids, numbered from `first_id` (the vocab size, plus the rows
    before the media's in the table). With `kinds`, the k-th placeholder must be of kinds[k].
    Raises ValueError when the prompt's placeholders and the items do not pair up."""
    found = sum(1 for token in ids if token in placeholder_kinds)
    if found != len(rows_per_item):
        raise ValueError(f"the prompt has {found} media placeholders for {len(rows_per_item)} media items")
    out: list[int] = []
    next_id, item = first_id, 0
    for token in ids:
        if token not in placeholder_kinds:
            out.append(token)
            continue
        if kinds is not None and kinds[item] != placeholder_kinds[token]:
            raise ValueError(
                f"media item {item} is {kinds[item]} but the prompt's placeholder {item} is for "
                f"{placeholder_kinds[token]}"
            )
        out.extend(range(next_id, next_id + rows_per_item[item]))
        next_id += rows_per_item[item]
        item += 1
    return out


def expand_placeholders(
    ids: list[int], placeholder_id: int | Collection[int], rows_per_item: list[int], vocab_size: int
) -> list[int]:
    """`expand_media` without kinds: every placeholder id shares one numbering, in prompt order (a
    prompt with images and a video), its rows first in the table."""
    placeholders = [placeholder_id] if isinstance(placeholder_id, int) else placeholder_id
    return expand_media(ids, dict.fromkeys(placeholders, "media"), rows_per_item, vocab_size)


def prompt_table(features: list[np.ndarray]) -> np.ndarray:
    """The items' rows stacked as the engine's `prompt_embedding_table` [1, P, hidden]."""
    return np.concatenate(features, axis=0)[None].astype(np.float32)
