"""`LayersCall`: the decoder stack's layers in one call of our C++ op (`csrc/cpu_decoder_layers.cpp`)
for a decode step at a few rows.

At one or two rows a decode step is the weights streamed once (the `gemv` kernel) plus, per layer,
the Python that calls the layer's nine kernels: about 2 ms of a 13 ms SmolLM2 step, and, served,
the gaps in which torch's OpenMP workers fall asleep between kernels. The op runs the same kernels
in the same order on the same tensors, so the logits are the Python loop's bitwise
(tests/worker/test_layers_call.py); the stack takes it when a step fits (`runs`).

It serves the plain layer only: every projection on a method it calls the way the method does at a
few rows (`KINDS`: `gemv`'s dense bf16 or fp32 weights, `int4`'s torch kernel, `gguf`'s Q8_0 and
Q6_K blocks), `cpu_paged` attention over a cache in the model's dtype, no head norms (Qwen3) and no
residual multiplier (Granite); `build` says why not otherwise, and the loop runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tritonlm.worker import cpu_kernels
from tritonlm.worker.attention.base import AttentionBackend
from tritonlm.worker.attention.cpu_paged import CpuPagedBackend
from tritonlm.worker.attention.paged import PagedMetadata
from tritonlm.worker.linear import Projection, gemv, gguf
from tritonlm.worker.linear.int4 import Int4Projection
from tritonlm.worker.model_paths.stack_layer import StackLayer, StackNorm

# The projections the op multiplies, by its kind code (`Kind` in the C++ source).
KINDS = {gemv.GemvProjection: 0, Int4Projection: 1, gguf.GgufProjection: 2}


def _operands(projection: Projection) -> tuple[torch.Tensor, torch.Tensor | None, int, int] | str:
    """(weight, extra, kind, arg) of a projection as the op takes it, or why it cannot."""
    kind = KINDS.get(type(projection))
    if kind is None:
        return f"a projection is on the {projection.method!r} linear method, which it does not call"
    if isinstance(projection, Int4Projection):
        return projection.packed, projection.scales_and_zeros, kind, projection.group
    if isinstance(projection, gguf.GgufProjection):
        if projection.level != gemv.BEST:
            return f"a GGUF projection runs its level {projection.level} loop, not {gemv.BEST}"
        return projection.blocks, None, kind, projection.kind
    return projection.weight, None, kind, 0


@dataclass
class LayersCall:
    """The op's per-layer arguments, in its order (`decoder_layers` in the C++ source)."""

    layer_ids: list[int]  # the KV cache's layer index of each layer
    # q/k/v, o, gate/up and down per layer: their weights, extra tensors, kinds, arguments, biases
    weights: list[torch.Tensor]
    extras: list[torch.Tensor | None]
    kinds: list[int]
    args: list[int]
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
        layers: Sequence[StackLayer],
        next_norms: Sequence[StackNorm],
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
        operands, biases = [], []
        for layer in layers:
            for projection in (layer.qkv, layer.o, layer.gate_up, layer.down):
                found = _operands(projection)
                if isinstance(found, str):
                    return found
                operands.append(found)
                biases.append(projection.bias)
        weights, extras, kinds, args = (list(column) for column in zip(*operands, strict=True))
        pairs = zip(layers, next_norms, strict=True)
        norms = [norm for layer, after in pairs for norm in (layer.post_attention_norm, after)]
        return cls(
            layer_ids=[layer.attention.layer_idx for layer in layers],
            weights=weights,
            extras=extras,
            kinds=kinds,
            args=args,
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
            x, residual, self.weights, self.extras, self.kinds, self.args, self.biases, gemv.BEST,
            self.norms, self.eps, cos, sin,
            [cache.keys[i] for i in self.layer_ids], [cache.values[i] for i in self.layer_ids],
            meta.slot_mapping, meta.tables, meta.row_seq, meta.row_len, self.backend.block_size,
            self.scales, self.heads, self.kv_heads,
        )  # fmt: skip
