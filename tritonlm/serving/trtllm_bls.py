"""TensorRT-LLM's `tensorrt_llm_bls` model over our ensemble: the ensemble's own inputs and outputs
with a batch dimension in front (max_batch_size 1: every tensor [1, ...]). Triton's OpenAI frontend
(`--backend tensorrtllm`, model `tensorrt_llm_bls` or `ensemble` in its guide) sends exactly that
(`[[prompt]]`, `[[max_tokens]]`, stop_words `[1, n]`); the ensemble, unbatched because its steps
are, takes the same names without the batch dimension. Plain numpy (no Triton): `ensemble_bls`
runs the call.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tritonlm import contract
from tritonlm.errors import InvalidRequest

INPUTS: tuple[contract.Tensor, ...] = tuple(t for t, _ in contract.ENSEMBLE_INPUTS)
OUTPUTS: tuple[contract.Tensor, ...] = contract.ENSEMBLE_OUTPUTS
MAX_BATCH_SIZE = 1  # one request is one sequence of the ensemble


class Batched:
    """One request, its batch of one as the ensemble's request; each response gets its batch
    dimension back (a Translation of ensemble_bls: the last response is the ensemble's last)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], wanted: frozenset[str]) -> None:
        for name, value in tensors.items():
            if value.ndim == 0 or value.shape[0] != 1:
                raise InvalidRequest(f"{name}: expected a batch of one, got shape {list(value.shape)}")
        self.inputs = {name: value[0] for name, value in tensors.items()}
        self.outputs = tuple(sorted(wanted)) if wanted else tuple(t.name for t in OUTPUTS)

    @classmethod
    def start(cls, tensors: Mapping[str, np.ndarray], wanted: frozenset[str]) -> Batched:
        return cls(tensors, wanted)

    def convert(self, outputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
        return {name: value[None] for name, value in outputs.items()}, False

    @staticmethod
    def renamed(message: str) -> str:
        return message  # the same names
