"""TGI's watermark (Kirchenbauer et al. 2023): a green list of `gamma` of the vocabulary, seeded by
the previous token, gets `delta` added to its logits, so that a detector knowing the key can tell
generated text by its excess of green tokens."""

from __future__ import annotations

import torch

from tritonlm.sampling.params import SamplerInput

HASH_KEY = 15485863  # TGI's key: the same seed gives TGI's green lists


class Watermark:
    def __init__(self, gamma: float = 0.5, delta: float = 2.0):
        self.gamma = gamma
        self.delta = delta

    def concerns(self, s: SamplerInput) -> bool:
        return s.params.watermark

    def greenlist(self, previous_token: int, vocab: int) -> torch.Tensor:
        rng = torch.Generator(device="cpu")
        rng.manual_seed(HASH_KEY * previous_token)
        return torch.randperm(vocab, generator=rng)[: int(self.gamma * vocab)]

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        # Each row's list comes from its own seed, hence one draw per row; the update is one write.
        vocab = logits.shape[1]
        previous = [s.output_ids[-1] if s.output_ids else s.prompt_ids[-1] for s in inputs]
        green = torch.cat([self.greenlist(p, vocab) for p in previous])
        row = torch.tensor(rows).repeat_interleave(int(self.gamma * vocab))
        logits[row.to(logits.device), green.to(logits.device)] += self.delta
