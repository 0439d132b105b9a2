"""Choosing one token per sequence of a batched engine step.

1. The logits processors, in place, in the pipeline's order (tritonlm.sampling.logits_processors):
   embedding bias, repetition penalty, presence/frequency penalties, no-repeat n-grams, bad words,
   min_length, watermark, then the slot for a grammar token mask. The engine builds its pipeline
   from its settings and passes it in.
2. Temperature; log-probs are taken here (after temperature, before any filter).
3. Top-k, top-p and typical-p over the rows that sample (`filter_logits`).
4. Greedy argmax, or a seeded draw per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tritonlm.sampling.logits_processors import LogitsPipeline, default_pipeline
from tritonlm.sampling.params import SamplerInput, SamplingParams

# SamplerInput and SamplingParams too: the engine and tests import them from here.
__all__ = [
    "LogProbs",
    "SamplerInput",
    "SamplingParams",
    "choose",
    "draw",
    "filter_logits",
    "log_probs_of",
    "probabilities",
    "process",
    "sample",
    "top_alternatives",
]

DEFAULT_PIPELINE = default_pipeline()  # the settings' defaults; the engine passes its own


def filter_logits(logits: torch.Tensor, batch: list[SamplerInput]) -> torch.Tensor:
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


def process(
    logits: torch.Tensor, batch: list[SamplerInput], processors: LogitsPipeline | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Steps 1-2: the logits processors and temperature over `logits` [batch, vocab]; returns them
    and the log probs (None unless a request asked for them)."""
    processors = DEFAULT_PIPELINE if processors is None else processors
    logits = processors(logits.float(), batch)
    temperature = torch.tensor(
        [1.0 if s.params.greedy else s.params.temperature for s in batch], device=logits.device
    )[:, None]
    logits = logits / temperature
    log_probs = logits.log_softmax(dim=-1) if any(s.params.return_log_probs for s in batch) else None
    return logits, log_probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from `probs` [vocab]: an exponential race (equivalent to multinomial), argmax p / E
    with E ~ Exp(1) drawn from the request's own generator, so a seeded request ignores what else is
    in the batch."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / noise).argmax())


def choose(logits: torch.Tensor, batch: list[SamplerInput]) -> list[int]:
    """Steps 3-4 on processed logits: greedy argmax, or a draw after top-k/top-p/typical-p."""
    tokens = logits.argmax(dim=-1)
    sampling = [i for i, s in enumerate(batch) if not s.params.greedy]
    if sampling:
        probs = filter_logits(logits[sampling], [batch[i] for i in sampling]).softmax(dim=-1)
        for row, i in enumerate(sampling):
            tokens[i] = draw(probs[row], batch[i].generator)
    return tokens.tolist()


def probabilities(logits: torch.Tensor, s: SamplerInput) -> torch.Tensor:
    """The distribution `choose` draws from for one processed row [vocab]: one-hot on the argmax
    for a greedy request, else the filtered softmax."""
    if s.params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).to(logits.dtype)
    return filter_logits(logits[None].clone(), [s])[0].softmax(dim=-1)


def log_probs_of(
    log_probs: torch.Tensor, rows: list[int], tokens: list[int], batch: list[SamplerInput]
) -> LogProbs:
    """The log probs of `tokens[j]` under row `rows[j]` (and alternatives where asked), indexed by j;
    `batch[j]` is that row's input."""
    index = torch.tensor(rows, dtype=torch.long, device=log_probs.device)
    chosen = log_probs[index].gather(1, torch.tensor(tokens, device=log_probs.device)[:, None]).squeeze(1)
    wanted = [j for j, s in enumerate(batch) if s.params.num_top_log_probs]
    top_ids, top_values = top_alternatives(
        log_probs[index], wanted, [batch[j].params.num_top_log_probs for j in wanted]
    )
    return LogProbs(chosen.tolist(), top_ids, top_values)


@torch.inference_mode()
def sample(
    logits: torch.Tensor, batch: list[SamplerInput], processors: LogitsPipeline | None = None
) -> tuple[list[int], LogProbs | None]:
    """Chooses one token per row of `logits` [batch, vocab] after `processors` (default: the default
    pipeline with the settings' defaults); returns the tokens and their log-probs (None unless a
    request asked for them)."""
    logits, log_probs = process(logits, batch, processors)
    chosen = choose(logits, batch)
    if log_probs is None:
        return chosen, None
    return chosen, log_probs_of(log_probs, list(range(len(chosen))), chosen, batch)
