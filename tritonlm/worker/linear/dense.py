"""`torch`: the weight as loaded, multiplied by `F.linear`. Runs on every device and dtype."""

from __future__ import annotations

import torch
from torch.nn import functional

from tritonlm.worker.linear.base import LinearMethod, Projection


class DenseProjection(Projection):
    method = "torch"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0])
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return functional.linear(x, self.weight, self.bias)


class DenseTorch(LinearMethod):
    name = "torch"

    @classmethod
    def supports(cls, weight: torch.Tensor) -> str | None:
        return None

    @classmethod
    def prepare(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Projection:
        return DenseProjection(weight, bias)
