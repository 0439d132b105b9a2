"""Per-request sampling parameters and the batched logits pipeline of one engine step.

Order (as transformers/TGI apply them): embedding bias, repetition/presence/frequency penalties,
no-repeat n-grams, bad words, min_length, watermark; then log-probs are taken (after temperature);
then temperature, top-k, top-p, typical-p; then greedy argmax or a seeded draw per request.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tritonlm.sampling.params import SamplingParams

# TGI's watermark (Kirchenbauer et al.): a green list seeded by the previous token gets a logit bonus.
WATERMARK_GAMMA = float(os.environ.get("WATERMARK_GAMMA", "0.5"))
WATERMARK_DELTA = float(os.environ.get("WATERMARK_DELTA", "2.0"))
WATERMARK_HASH_KEY = 15485863


@dataclass
class SamplerInput:
    """What the sampler needs from one running sequence."""

    params: SamplingParams
    prompt_ids: tuple[int, ...]
    output_ids: list[int]
    generator: torch.Generator | None

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]


def _token_matrix(rows: list[list[int]], fill: int, device: torch.device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), fill, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(r)
    return out.to(device)


def _apply_penalties(logits: torch.Tensor, batch: list[SamplerInput]) -> None:
    vocab = logits.shape[1]
    rep = [i for i, s in enumerate(batch) if s.params.repetition_penalty != 1.0]
    if rep:  # transformers' rule over prompt and output: divide positive logits, multiply negative ones
        ids = _token_matrix([batch[i].tokens for i in rep], vocab, logits.device)
        seen = torch.zeros(len(rep), vocab + 1, dtype=torch.bool, device=logits.device)
        seen.scatter_(1, ids, True)
        seen = seen[:, :vocab]
        penalty = torch.tensor([batch[i].params.repetition_penalty for i in rep], device=logits.device)[
            :, None
        ]
        sub = logits[rep]
        sub = torch.where(seen, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
        logits[rep] = sub
    pf = [i for i, s in enumerate(batch) if s.params.presence_penalty or s.params.frequency_penalty]
    if pf:  # OpenAI's rule over generated tokens only
        ids = _token_matrix([batch[i].output_ids for i in pf], vocab, logits.device)
        counts = torch.zeros(len(pf), vocab + 1, device=logits.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
        counts = counts[:, :vocab]
        pres = torch.tensor([batch[i].params.presence_penalty for i in pf], device=logits.device)[:, None]
        freq = torch.tensor([batch[i].params.frequency_penalty for i in pf], device=logits.device)[:, None]
        logits[pf] -= freq * counts + pres * (counts > 0)


def _banned_tokens(s: SamplerInput) -> list[int]:
    p = s.params
    banned: list[int] = []
    tokens = s.tokens
    n = p.no_repeat_ngram_size
    if n > 0 and len(tokens) >= n:
        prefix = tuple(tokens[len(tokens) - n + 1 :])
        banned += [
            tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n - 1]) == prefix
        ]
    for word in p.bad_words:
        if len(word) == 1 or tokens[len(tokens) - len(word) + 1 :] == word[:-1]:
            banned.append(word[-1])
    if len(s.output_ids) < p.min_length:  # no ending before min_length, by end id or stop token
        banned += [p.end_id] if p.end_id >= 0 else []
        banned += p.stop_token_ids
    return banned


def _watermark_greenlist(previous_token: int, vocab: int, device: torch.device) -> torch.Tensor:
    rng = torch.Generator(device="cpu")
    rng.manual_seed(WATERMARK_HASH_KEY * previous_token)
    return torch.randperm(vocab, generator=rng)[: int(WATERMARK_GAMMA * vocab)].to(device)


def _filter(logits: torch.Tensor, batch: list[SamplerInput]) -> torch.Tensor:
    """Top-k, top-p and typical-p over the rows that sample; masked entries become -inf."""
    device = logits.device
    top_k = torch.tensor([s.params.top_k for s in batch], device=device)
    top_p = torch.tensor([s.params.top_p or 1.0 for s in batch], device=device)
    if bool((top_k > 0).any()) or bool((top_p < 1.0).any()):
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


def process_logits(logits: torch.Tensor, batch: list[SamplerInput]) -> torch.Tensor:
    """Embedding bias, penalties, banned tokens (no-repeat n-grams, bad words, min_length) and the
    watermark, in place on float `logits` [batch, vocab] (beam search runs it on log probs)."""
    for i, s in enumerate(batch):
        if s.params.embedding_bias is not None:
            logits[i] += s.params.embedding_bias.to(logits.device)
    _apply_penalties(logits, batch)
    for i, s in enumerate(batch):
        banned = _banned_tokens(s)
        if banned:
            logits[i, banned] = float("-inf")
        if s.params.watermark:
            previous = s.output_ids[-1] if s.output_ids else s.prompt_ids[-1]
            logits[i, _watermark_greenlist(previous, logits.shape[1], logits.device)] += WATERMARK_DELTA
    return logits


@dataclass
class LogProbs:
    """Log probs of one step's chosen tokens (`log_probs[i]` for row i), and for rows that asked for
    alternatives, the best `num_top_log_probs` (ids and log probs, best first)."""

    chosen: list[float]
    top_ids: dict[int, list[int]]
    top_values: dict[int, list[float]]

    def __getitem__(self, row: int) -> float:
        return self.chosen[row]


def top_alternatives(log_probs: torch.Tensor, rows: list[int], ks: list[int]) -> tuple[dict, dict]:
    """The best `ks[j]` entries of `log_probs[rows[j]]`, as ({row: ids}, {row: values})."""
    if not rows:
        return {}, {}
    values, ids = log_probs[rows].topk(max(ks), dim=-1)
    values, ids = values.tolist(), ids.tolist()
    return (
        {r: ids[j][: ks[j]] for j, r in enumerate(rows)},
        {r: values[j][: ks[j]] for j, r in enumerate(rows)},
    )


@torch.inference_mode()
def sample(logits: torch.Tensor, batch: list[SamplerInput]) -> tuple[list[int], LogProbs | None]:
    """Chooses one token per row of `logits` [batch, vocab]; returns the tokens and their log-probs
    (None unless a request asked for them)."""
    logits = process_logits(logits.float(), batch)
    temperature = torch.tensor(
        [1.0 if s.params.greedy else s.params.temperature for s in batch], device=logits.device
    )[:, None]
    logits = logits / temperature
    log_probs = logits.log_softmax(dim=-1) if any(s.params.return_log_probs for s in batch) else None

    tokens = logits.argmax(dim=-1)
    sampling = [i for i, s in enumerate(batch) if not s.params.greedy]
    if sampling:
        probs = _filter(logits[sampling], [batch[i] for i in sampling]).softmax(dim=-1)
        for row, i in enumerate(sampling):
            # Exponential race (equivalent to multinomial): argmax p / E with E ~ Exp(1) drawn from
            # the request's own generator, so a seeded request ignores what else is in the batch.
            noise = torch.empty_like(probs[row]).exponential_(generator=batch[i].generator)
            tokens[i] = (probs[row] / noise).argmax()
    chosen = tokens.tolist()
    if log_probs is None:
        return chosen, None
    rows = [i for i, s in enumerate(batch) if s.params.num_top_log_probs]
    top_ids, top_values = top_alternatives(log_probs, rows, [batch[i].params.num_top_log_probs for i in rows])
    return chosen, LogProbs(log_probs.gather(1, tokens[:, None]).squeeze(1).tolist(), top_ids, top_values)
