"""`min_length`: no ending before that many tokens were generated, neither by the end id nor by a
one-token stop word."""

from __future__ import annotations

import torch

from tritonlm.sampling.logits_processors.tokens import ban
from tritonlm.sampling.params import SamplerInput


def _enders(s: SamplerInput) -> list[int]:
    return ([s.params.end_id] if s.params.end_id >= 0 else []) + s.params.stop_token_ids


class MinLength:
    def concerns(self, s: SamplerInput) -> bool:
        return len(s.output_ids) < s.params.min_length and bool(_enders(s))

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        enders = [_enders(s) for s in inputs]
        ban(
            logits,
            [row for row, ids in zip(rows, enders, strict=True) for _ in ids],
            [i for ids in enders for i in ids],
        )
