"""Adds each token row's adapter to the model's projections: mixed adapters in one forward step.

Forward hooks on the attention and MLP projections (q/k/v/o, gate/up/down) of every layer; nothing in
the model is replaced or merged. Before each forward the model runner calls `step` with the adapter
of each packed sequence and its number of tokens; the hooks then add, per projection and per group of
rows sharing an adapter, `(x·Aᵀ)·Bᵀ` (B already scaled) to the projection's output: the punica idea
in plain torch. Rows without an adapter get nothing added, and a step without adapters costs one
check per projection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from tritonlm.layer_names import layer_module
from tritonlm.lora.adapter import LoraAdapter, Shapes
from tritonlm.lora.format import HF_TO_MODULE


class LoraLayers:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.projections: dict[tuple[int, str], nn.Linear] = {}
        for name, module in model.named_modules():
            match = layer_module(name)
            # nn.Linear, or what `worker/fused.py` put in its place (same features and hooks)
            if match and match.projection in HF_TO_MODULE and hasattr(module, "out_features"):
                self.projections[(match.layer, match.projection)] = module
        self.shapes: Shapes = {k: (m.in_features, m.out_features) for k, m in self.projections.items()}
        # This step's groups: (adapter, packed row indices, or None for every row).
        self.groups: list[tuple[LoraAdapter, torch.Tensor | None]] = []
        self.hooked = False

    @contextlib.contextmanager
    def step(
        self, adapters: Sequence[LoraAdapter | None], num_tokens: Sequence[int], device: torch.device
    ) -> Iterator[None]:
        """For one forward: packed sequence i feeds `num_tokens[i]` rows with `adapters[i]`."""
        rows: dict[int, tuple[LoraAdapter, list[int]]] = {}
        offset = 0
        for adapter, n in zip(adapters, num_tokens, strict=True):
            if adapter is not None:
                rows.setdefault(id(adapter), (adapter, []))[1].extend(range(offset, offset + n))
            offset += n
        if not rows:
            yield
            return
        if not self.hooked:  # installed on the loop thread, the first time an adapter runs
            for key, module in self.projections.items():
                module.register_forward_hook(self._hook(key))
            self.hooked = True
        self.groups = [
            (adapter, None if len(r) == offset else torch.tensor(r, dtype=torch.long, device=device))
            for adapter, r in rows.values()
        ]
        try:
            yield
        finally:
            self.groups = []

    def _hook(self, key: tuple[int, str]):  # a torch forward hook
        def add_lora(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            for adapter, rows in self.groups:
                ab = adapter.weights.get(key)
                if ab is None:
                    continue
                a, b = ab
                if rows is None:
                    output.add_((args[0] @ a.T) @ b.T)
                else:  # rows of the packed [1, tokens, features] batch
                    output[0].index_add_(0, rows, (args[0][0, rows] @ a.T) @ b.T)

        return add_lora
