"""TensorRT-LLM's multimodal prompt convention: each media item's placeholder token becomes as many
positions as the item has feature rows, with ids >= vocab_size that select rows of the prompt
embedding table (row = id - vocab_size), in the order the items appear."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
