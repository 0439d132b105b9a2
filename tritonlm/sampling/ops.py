"""The sampling step's primitives, shared by the sampler and draft verification
(sampling.acceptance): temperature, top-k / top-p / typical-p, the seeded draw (draws.py), and
the best alternatives of a log-probs row."""

from __future__ import annotations

import torch

from tritonlm.sampling.draws import draw_rows
from tritonlm.sampling.params import SamplerInput, SamplingParams


def temperature_of(params: SamplingParams) -> float:
    """The one temperature rule (generated tokens and prompt log probs alike): a greedy request's
    logits are not scaled."""
    return 1.0 if params.greedy else params.temperature


def apply_temperature(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """`logits` [rows, vocab] divided by each row's temperature: a new tensor, or `logits` itself
    when every temperature is 1 (a greedy batch: the division is a pass over the whole vocabulary)."""
    temperatures = [temperature_of(p) for p in params]
    if all(t == 1.0 for t in temperatures):
        return logits
    return logits / torch.tensor(temperatures, device=logits.device)[:, None]


def filter_logits(logits: torch.Tensor, batch: list[SamplerInput]) -> torch.Tensor:
    """Top-k, top-p and typical-p over the rows that sample; masked entries become -inf."""
    device = logits.device
    # Decided on the host: a test of the device tensors would be a device→host read.
    if any(s.params.top_k > 0 or (s.params.top_p or 1.0) < 1.0 for s in batch):
        top_k = torch.tensor([s.params.top_k for s in batch], device=device)
        top_p = torch.tensor([s.params.top_p or 1.0 for s in batch], device=device)
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(logits.shape[1], device=device)[None, :]
        remove = (top_k[:, None] > 0) & (rank >= top_k[:, None])
        probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (always keeps the first)
        remove |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    for i, s in enumerate(batch):
        if s.params.typical_p < 1.0:  # keep the tokens whose surprise is closest to the entropy
            log_p = logits[i].log_softmax(dim=-1)
            p = log_p.exp()
            entropy = -(p * log_p).nan_to_num().sum()
            order = (-log_p - entropy).abs().argsort()
            cum = p[order].cumsum(dim=-1)
            keep = int((cum < s.params.typical_p).sum()) + 1
            row = torch.full_like(logits[i], float("-inf"))
            row[order[:keep]] = logits[i][order[:keep]]
            logits[i] = row
    return logits


def draw(probs: torch.Tensor, s: SamplerInput) -> int:
    """One token from `probs` [vocab] (any scale) with the row's own draw at its position."""
    return int(draw_rows(probs[None], [s.random_key or 0], [s.position])[0])


def choose(logits: torch.Tensor, batch: list[SamplerInput]) -> torch.Tensor:
    """One token per processed row, on the device (int64 [rows]): greedy argmax, or a draw after
    top-k/top-p/typical-p, each row's race from its request's key and its position (draws.py), all
    rows at once."""
    tokens = logits.argmax(dim=-1)
    sampling = [i for i, s in enumerate(batch) if not s.params.greedy]
    if sampling:
        probs = filter_logits(logits[sampling], [batch[i] for i in sampling]).softmax(dim=-1)
        keys = [batch[i].random_key or 0 for i in sampling]
        positions = [batch[i].position for i in sampling]
        drawn = draw_rows(probs, keys, positions)
        if len(sampling) == len(batch):
            return drawn
        tokens[torch.tensor(sampling, device=tokens.device)] = drawn
    return tokens


def probabilities(logits: torch.Tensor, s: SamplerInput) -> torch.Tensor:
    """The distribution `choose` draws from for one processed row [vocab]: one-hot on the argmax
    for a greedy request, else the filtered softmax."""
    if s.params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).to(logits.dtype)
    return filter_logits(logits[None].clone(), [s])[0].softmax(dim=-1)


def top_alternatives(log_probs: torch.Tensor, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """The best `k` entries of each row of `log_probs` [rows, vocab]: (ids, values), best first."""
    values, ids = log_probs.topk(k, dim=-1)
    return ids.tolist(), values.tolist()
