"""OpenAI's presence and frequency penalties, over generated tokens only (not the prompt):
logit -= frequency_penalty * count + presence_penalty * (count > 0)."""

from __future__ import annotations

import torch

from tritonlm.sampling.logits_processors.tokens import token_counts
from tritonlm.sampling.params import SamplerInput


class PresenceFrequencyPenalty:
    def concerns(self, s: SamplerInput) -> bool:
        return bool(s.params.presence_penalty or s.params.frequency_penalty)

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        counts = token_counts([s.output_ids for s in inputs], logits.shape[1], logits.device)
        presence = torch.tensor([s.params.presence_penalty for s in inputs], device=logits.device)[:, None]
        frequency = torch.tensor([s.params.frequency_penalty for s in inputs], device=logits.device)[:, None]
        logits[rows] -= frequency * counts + presence * (counts > 0)
