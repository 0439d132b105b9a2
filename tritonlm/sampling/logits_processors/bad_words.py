"""TensorRT-LLM's `bad_words_list`: ban a word's last token when the sequence ends with the rest of it
(a one-token word is always banned)."""

from __future__ import annotations

import torch

from tritonlm.sampling.logits_processors.tokens import ban, last_tokens
from tritonlm.sampling.params import SamplerInput


class BadWords:
    def concerns(self, s: SamplerInput) -> bool:
        return bool(s.params.bad_words)

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        hits = [
            (row, word[-1])
            for row, s in zip(rows, inputs, strict=True)
            for word in s.params.bad_words
            if last_tokens(s, len(word) - 1) == list(word[:-1])
        ]
        if hits:
            banned_rows, banned_ids = zip(*hits, strict=True)
            ban(logits, banned_rows, banned_ids)
