"""`LinearMethod`: how one projection's weights are stored and multiplied.

A method turns a projection's weight and bias (as loaded, `[out, in]`) into a `Projection`, the
callable `x -> x @ weightᵀ + bias` in whatever form the method keeps the weight (as loaded, pre-packed
for oneDNN, quantized, …). The runner picks a method per projection at load time
(`linear.choose`); the fused groups (`worker/fused.py`), the model fast paths and LoRA's hooks only
ever call the projection, so any method composes with all of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class QuantizedWeight:
    """What every quantized weight form (`int4.Int4Weight`, `int8.Int8Weight`) has: its integers `q`
    laid out `[out, in]` (so `shape` and `device` are theirs), the activations' `dtype` it
    multiplies (the model's, as a dense weight's own dtype is), and the dense weight it stands for."""

    q: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    @property
    def device(self) -> torch.device:
        return self.q.device

    def dequantize(self) -> torch.Tensor:
        """The dense weight, in `dtype` (tests, and projections no kernel takes)."""
        raise NotImplementedError


class Projection(ABC):
    """`x [..., in] -> [..., out]` for a fixed weight, in the form its method keeps it."""

    method: str = ""

    def __init__(self, in_features: int, out_features: int) -> None:
        self.in_features, self.out_features = in_features, out_features

    @abstractmethod
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class RowsProjection(Projection):
    """A projection whose kernel takes a 2-D batch of rows (`multiply`): the leading dimensions
    flattened, the bias added after."""

    bias: torch.Tensor | None = None

    @abstractmethod
    def multiply(self, rows: torch.Tensor) -> torch.Tensor: ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.multiply(x.reshape(-1, x.shape[-1]))
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)


class LinearMethod(ABC):
    name: str = ""
    holds: type = torch.Tensor  # the weight's form it takes: a dense tensor, or a quantized weight

    @classmethod
    @abstractmethod
    def supports(cls, weight: torch.Tensor) -> str | None:
        """Why this method cannot hold `weight` (its dtype, device, this build), or None."""

    @classmethod
    @abstractmethod
    def prepare(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Projection:
        """The projection of `weight` `[out, in]` and `bias` `[out]` (detached; may be consumed)."""
