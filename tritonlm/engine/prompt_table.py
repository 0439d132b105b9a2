"""Prompt tables (p-tuning, and the door for multimodal features), TensorRT-LLM's convention: a
request carries a table of P input-embedding rows, and each prompt id >= the model's vocab size
selects row `id - vocab_size` instead of a token embedding.

The selected rows become the request's `PromptEmbeds` (the engine's embedding-row path): the runner
feeds them in place of those positions, and the prefix cache keys them by content, so two tables
that use the same ids never share KV blocks, and the same rows do.
"""

from __future__ import annotations

import numpy as np
import torch

from tritonlm.engine.request import PromptEmbeds


def table_embeds(ids: np.ndarray, table: torch.Tensor, vocab_size: int) -> PromptEmbeds | None:
    """The rows `table[id - vocab_size]` for the prompt positions whose id is >= `vocab_size`
    (None when there are none). `ids` [prompt] int, `table` [P, hidden] float; the caller checked
    that every such id is below `vocab_size + P`."""
    positions = np.flatnonzero(ids >= vocab_size)
    if positions.size == 0:
        return None
    rows = table[torch.from_numpy(ids[positions] - vocab_size)]
    return PromptEmbeds.of(positions.tolist(), rows)
