"""transformers' `no_repeat_ngram_size`: ban every token that would complete an n-gram already present
in prompt + output."""

from __future__ import annotations

import torch

from tritonlm.sampling.logits_processors.tokens import ban, left_padded
from tritonlm.sampling.params import SamplerInput


class NoRepeatNGram:
    def concerns(self, s: SamplerInput) -> bool:
        n = s.params.no_repeat_ngram_size
        return n > 0 and len(s.prompt_ids) + len(s.output_ids) >= n

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        by_size: dict[int, list[int]] = {}  # one tensor pass per distinct n (usually one)
        for j, s in enumerate(inputs):
            by_size.setdefault(s.params.no_repeat_ngram_size, []).append(j)
        for n, group in by_size.items():
            # Right-aligned, so every row's last n-1 tokens (the n-gram being started) are the last
            # columns; the -1 padding matches no real token, so no padded window matches.
            tokens = left_padded([inputs[j].tokens for j in group], fill=-1)
            windows = tokens.unfold(1, n, 1)  # [rows, positions, n]: every n-gram
            started = tokens[:, tokens.shape[1] - n + 1 :]
            hit_row, hit_pos = (windows[..., :-1] == started[:, None, :]).all(-1).nonzero(as_tuple=True)
            row_of = torch.tensor([rows[j] for j in group])
            ban(logits, row_of[hit_row], windows[hit_row, hit_pos, -1])
