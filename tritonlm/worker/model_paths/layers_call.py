"""`LayersCall`: the decoder stack's layers in one call of our C++ op (`csrc/cpu_decoder_layers.cpp`)
for a decode step at a few rows.

At one or two rows a decode step is the weights streamed once (the `gemv` kernel) plus, per layer,
the Python that calls the layer's nine kernels: about 2 ms of a 13 ms SmolLM2 step, and, served,
the gaps in which torch's OpenMP workers fall asleep between kernels. The op runs the same kernels
in the same order on the same tensors, so the logits are the Python loop's bitwise
(tests/worker/test_layers_call.py); the stack takes it when a step fits (`runs`).

It serves the plain layer only: every projection on the `gemv` method (dense bf16 or fp32 on an
AVX-512 CPU), `cpu_paged` attention over a cache in the model's dtype, no head norms (Qwen3) and no
residual multiplier (Granite); `build` says why not otherwise, and the loop runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tritonlm.worker import cpu_kernels
from tritonlm.worker.attention.base import AttentionBackend
from tritonlm.worker.attention.cpu_paged import CpuPagedBackend
from tritonlm.worker.attention.paged import PagedMetadata
from tritonlm.worker.linear import gemv

if TYPE_CHECKING:
    from tritonlm.worker.model_paths.decoder_stack import _Layer, _Norm


@dataclass
class LayersCall:
    """The op's per-layer arguments, in its order (`decoder_layers` in the C++ source)."""

    layer_ids: list[int]  # the KV cache's layer index of each layer
    weights: list[torch.Tensor]  # q/k/v, o, gate/up, down per layer
    biases: list[torch.Tensor | None]
    norms: list[torch.Tensor]  # the post-attention norm, then the next layer's input norm
    eps: list[float]
    scales: list[float]  # each layer's attention scale
    heads: int
    kv_heads: int
    backend: CpuPagedBackend

    @classmethod
    def build(
        cls,
        layers: Sequence[_Layer],
        next_norms: Sequence[_Norm],
        residual_multiplier: float,
        backend: AttentionBackend,
    ) -> LayersCall | str:
        """The call over `layers` (each followed by its `next_norms`), or why the loop runs them."""
        if not isinstance(backend, CpuPagedBackend) or backend.kv_cache_dtype != "auto":
            return "its attention is not cpu_paged over a cache in the model's dtype"
        if residual_multiplier != 1.0:
            return "its layers scale their residual (Granite's multiplier)"
        if any(layer.q_norm is not None for layer in layers):
            return "its layers norm each query and key head (Qwen3's)"
        if len({(layer.heads, layer.kv_heads) for layer in layers}) != 1:
            return "its layers have different head counts"
        weights, biases = [], []
        for layer in layers:
            for projection in (layer.qkv, layer.o, layer.gate_up, layer.down):
                if not isinstance(projection, gemv.GemvProjection):
                    return f"a projection is on the {projection.method!r} linear method, not gemv"
                weights.append(projection.weight)
                biases.append(projection.bias)
        pairs = zip(layers, next_norms, strict=True)
        norms = [norm for layer, after in pairs for norm in (layer.post_attention_norm, after)]
        return cls(
            layer_ids=[layer.attention.layer_idx for layer in layers],
            weights=weights,
            biases=biases,
            norms=[n.weight for n in norms],
            eps=[n.eps for n in norms],
            scales=[layer.head_dim**-0.5 if layer.scaling is None else layer.scaling for layer in layers],
            heads=layers[0].heads,
            kv_heads=layers[0].kv_heads,
            backend=backend,
        )

    @staticmethod
    def runs(rows: int, keep: Sequence[int]) -> bool:
        """Whether a step of `rows` tokens, keeping the logits of `keep`, is one the call runs: a
        few rows (gemv's), every row kept, not inside a compiled step (which sees the kernels)."""
        return rows <= gemv.MAX_ROWS and len(keep) == rows and not torch.compiler.is_compiling()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Every layer over x (input-normed) and residual, in place: x ends final-normed."""
        meta: PagedMetadata = self.backend.metadata
        cache = self.backend.cache
        cpu_kernels.kernels().decoder_layers(
            x, residual, self.weights, self.biases, self.norms, self.eps, cos, sin,
            [cache.keys[i] for i in self.layer_ids], [cache.values[i] for i in self.layer_ids],
            meta.slot_mapping, meta.tables, meta.row_seq, meta.row_len, self.backend.block_size,
            self.scales, self.heads, self.kv_heads, gemv.BEST,
        )  # fmt: skip
