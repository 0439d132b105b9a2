"""TensorRT-LLM's `embedding_bias`: a per-request vector added to the logits."""

from __future__ import annotations

import torch

from tritonlm.sampling.params import SamplerInput


class EmbeddingBias:
    def concerns(self, s: SamplerInput) -> bool:
        return s.params.embedding_bias is not None

    def apply(self, logits: torch.Tensor, rows: list[int], inputs: list[SamplerInput]) -> None:
        bias = torch.stack([s.params.embedding_bias for s in inputs]).to(logits.device, logits.dtype)
        logits[rows] += bias
