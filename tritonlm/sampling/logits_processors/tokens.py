"""Token-id tensors the processors share. Ids outside the logits' vocabulary never index them: a
tokenizer may know more tokens than the model has output rows (added tokens), so such ids are
counted for nothing and never banned (they cannot be drawn anyway)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch

from tritonlm.sampling.params import SamplerInput


def token_counts(rows: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(rows), vocab] float: how often each id occurs in each row of ids."""
    ids = torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long).to(device)
    row = torch.arange(len(rows)).repeat_interleave(torch.tensor([len(r) for r in rows])).to(device)
    ids = torch.where((ids >= 0) & (ids < vocab), ids, vocab)  # the spare last column takes the rest
    counts = torch.zeros(len(rows), vocab + 1, device=device)
    counts.index_put_((row, ids), torch.ones_like(ids, dtype=counts.dtype), accumulate=True)
    return counts[:, :vocab]


def left_padded(rows: Sequence[Sequence[int]], fill: int) -> torch.Tensor:
    """[len(rows), longest] ids on the CPU, right-aligned so that every row ends in the last column."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, width - len(r) :] = torch.tensor(r)
    return out


def last_tokens(s: SamplerInput, k: int) -> list[int]:
    """The last `k` tokens of prompt + output (all of them when fewer), without copying the rest."""
    if k <= 0:
        return []
    tail = s.output_ids[-k:]
    if len(tail) < k:
        tail = [*s.prompt_ids[-(k - len(tail)) :], *tail]
    return tail


def ban(logits: torch.Tensor, rows: Sequence[int] | torch.Tensor, ids: Sequence[int] | torch.Tensor) -> None:
    """Sets logits[rows[k], ids[k]] to -inf for every k, in one indexed write."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    ids = torch.as_tensor(ids, dtype=torch.long)
    inside = (ids >= 0) & (ids < logits.shape[1])
    logits[rows[inside].to(logits.device), ids[inside].to(logits.device)] = float("-inf")
