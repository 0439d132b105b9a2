"""transformers' (CTRL's) repetition penalty over prompt and output: a token seen before has its
positive logit divided by the penalty and its negative one multiplied."""

from __future__ import annotations

import torch

from tritonlm.sampling.logits_processors.tokens import token_counts
from tritonlm.sampling.params import SamplerInput


class RepetitionPenalty:
    def concerns(self, s: SamplerInput) -> bool:
        return s.params.repetition_penalty != 1.0

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        seen = token_counts([s.tokens for s in inputs], logits.shape[1], logits.device) > 0
        penalty = torch.tensor([s.params.repetition_penalty for s in inputs], device=logits.device)[:, None]
        sub = logits[rows]
        logits[rows] = torch.where(seen, torch.where(sub > 0, sub / penalty, sub * penalty), sub)
