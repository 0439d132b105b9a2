"""TensorRT-LLM's multimodal prompt convention: each media item's placeholder token becomes as many
positions as the item has feature rows, with ids >= vocab_size that select rows of the prompt
embedding table (row = id - vocab_size), in the order the items appear."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


def expand_placeholders(
    ids: list[int], placeholder_id: int | Collection[int], rows_per_item: list[int], vocab_size: int
) -> list[int]:
    """`ids` with the k-th placeholder replaced by rows_per_item[k] table ids. Several placeholder ids
    (a prompt with images and a video) share one numbering, in prompt order, so the items' rows
    must come in that order. Raises ValueError when the prompt's placeholders and the items do not
    pair up."""
    placeholders = {placeholder_id} if isinstance(placeholder_id, int) else set(placeholder_id)
    found = sum(token in placeholders for token in ids)
    if found != len(rows_per_item):
        raise ValueError(f"the prompt has {found} media placeholders for {len(rows_per_item)} media items")
    out: list[int] = []
    next_row, item = vocab_size, 0
    for token in ids:
        if token not in placeholders:
            out.append(token)
            continue
        out.extend(range(next_row, next_row + rows_per_item[item]))
        next_row += rows_per_item[item]
        item += 1
    return out


def prompt_table(features: list[np.ndarray]) -> np.ndarray:
    """The items' rows stacked as the engine's `prompt_embedding_table` [1, P, hidden]."""
    return np.concatenate(features, axis=0)[None].astype(np.float32)
