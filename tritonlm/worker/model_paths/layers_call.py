"""`LayersCall`: the decoder stack's layers in one call of our C++ op (`csrc/cpu_decoder_layers.cpp`)
for a decode step.

At one or two rows a decode step is the weights streamed once (the `gemv` kernel) plus, per layer,
the Python that calls the layer's nine kernels: about 2 ms of a 12 ms SmolLM2 step, and, served,
the gaps in which torch's OpenMP workers fall asleep between kernels. The op runs the same kernels
in the same order on the same tensors, so the logits are the Python loop's bitwise
(tests/worker/test_layers_call.py). The stack takes it when a step fits (`runs`): every row's
logits kept (decodes, and their proposals), at a row count the op calls every projection at.

Each projection is called as its linear method calls it at the step's rows (`Operands`, by the
op's kind codes): `gemv`'s kernel up to its rows and oneDNN's packed GEMM (the `onednn` method)
past them, torch's int4 kernel at any rows, our GGUF-block GEMV up to its rows (past them the
method decodes tiles in Python: the loop runs those steps). It serves the plain layer: `cpu_paged`
attention over a cache in the model's dtype, no head norms (Qwen3) and no residual multiplier
(Granite); `build` says why not otherwise, and the loop runs."""

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
from tritonlm.worker.linear.onednn import PackedProjection
from tritonlm.worker.model_paths.stack_layer import StackLayer, StackNorm

# The op's kind codes (`Kind` in the C++ source).
GEMV, INT4, GGUF, ONEDNN = 0, 1, 2, 3


@dataclass
class Operands:
    """Every layer's q/k/v, o, gate/up and down projections as the op takes them, at some rows."""

    weights: list[torch.Tensor]
    extras: list[torch.Tensor | None]  # int4: its scales and zeros
    kinds: list[int]
    args: list[int]  # int4: the group size; GGUF: the block type
    biases: list[torch.Tensor | None]

    @classmethod
    def of(cls, layers: Sequence[StackLayer], many: bool) -> Operands | str:
        """The layers' projections at more rows than gemv's (`many`) or at up to them, or why not."""
        found = []
        for layer in layers:
            for projection in (layer.qkv, layer.o, layer.gate_up, layer.down):
                operands = _operands(projection, many)
                if isinstance(operands, str):
                    return operands
                found.append((*operands, projection.bias))
        return cls(*(list(column) for column in zip(*found, strict=True)))


def _operands(projection: Projection, many: bool) -> tuple[torch.Tensor, torch.Tensor | None, int, int] | str:
    """(weight, extra, kind, arg) of a projection as its method runs it at many or a few rows, or
    why the op cannot call it so."""
    if isinstance(projection, gemv.GemvProjection):
        return _operands(projection.many_rows, many) if many else (projection.weight, None, GEMV, 0)
    if isinstance(projection, PackedProjection):
        return projection.weight, None, ONEDNN, 0
    if isinstance(projection, Int4Projection):
        return projection.packed, projection.scales_and_zeros, INT4, projection.group
    if isinstance(projection, gguf.GgufProjection):
        if many:
            return "past a few rows a GGUF projection decodes its blocks tile by tile"
        if projection.level != gemv.BEST:
            return f"a GGUF projection runs its level {projection.level} loop, not {gemv.BEST}"
        return projection.blocks, None, GGUF, projection.kind
    return f"a projection is on the {projection.method!r} linear method, which it does not call"


@dataclass
class LayersCall:
    """The op's arguments (`decoder_layers` in the C++ source) but the step's."""

    layer_ids: list[int]  # the KV cache's layer index of each layer
    few: Operands  # at up to gemv.MAX_ROWS rows
    many: Operands | None  # past them (None: the loop runs those steps; `many_refused` says why)
    many_refused: str | None
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
        few, many = Operands.of(layers, many=False), Operands.of(layers, many=True)
        if isinstance(few, str):
            return few
        pairs = zip(layers, next_norms, strict=True)
        norms = [norm for layer, after in pairs for norm in (layer.post_attention_norm, after)]
        return cls(
            layer_ids=[layer.attention.layer_idx for layer in layers],
            few=few,
            many=None if isinstance(many, str) else many,
            many_refused=many if isinstance(many, str) else None,
            norms=[n.weight for n in norms],
            eps=[n.eps for n in norms],
            scales=[layer.head_dim**-0.5 if layer.scaling is None else layer.scaling for layer in layers],
            heads=layers[0].heads,
            kv_heads=layers[0].kv_heads,
            backend=backend,
        )

    def runs(self, rows: int, keep: Sequence[int]) -> bool:
        """Whether a step of `rows` tokens, keeping the logits of `keep`, is one the call runs: every
        row kept, its projections callable at that many rows, not inside a compiled step (which
        sees the kernels)."""
        if len(keep) != rows or torch.compiler.is_compiling():
            return False
        return rows <= gemv.MAX_ROWS or self.many is not None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Every layer over x (input-normed) and residual, in place: x ends final-normed."""
        meta: PagedMetadata = self.backend.metadata
        cache = self.backend.cache
        ops = self.few if x.shape[0] <= gemv.MAX_ROWS else self.many
        cpu_kernels.kernels().decoder_layers(
            x, residual, ops.weights, ops.extras, ops.kinds, ops.args, ops.biases, gemv.BEST,
            self.norms, self.eps, cos, sin,
            [cache.keys[i] for i in self.layer_ids], [cache.values[i] for i in self.layer_ids],
            meta.slot_mapping, meta.tables, meta.row_seq, meta.row_len, self.backend.block_size,
            self.scales, self.heads, self.kv_heads,
        )  # fmt: skip
