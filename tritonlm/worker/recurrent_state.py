"""The recurrent state of a hybrid model's linear-attention layers (Qwen3-Next's Gated DeltaNet), one
slot per running sequence, and those layers' forward over a packed step.

A Gated DeltaNet layer keeps no keys or values: each sequence carries a conv state (the last
`conv_kernel_size` inputs of its causal depthwise conv1d) and a recurrent state (an fp32 matrix per
value head, updated by the gated delta rule at every token). They live here in slot-indexed pools,
per layer `conv[slots, conv_dim, kernel]` (the model's dtype) and `recurrent[slots, v_heads, k_dim,
v_dim]` (fp32, as transformers keeps it), beside the paged KV cache of the attention layers; the
engine gives each running sequence a slot when it is admitted and takes it back when the sequence
finishes or is preempted, and a beam forked from another a slot with its parent's state copied in
(`copy_slots`; `engine.block_manager`), and the runner sizes the KV cache after taking
their bytes out of its memory (`ModelRunner`).

transformers' layer reads its own cache with one sequence per batch row; ours (`_layer_forward`,
put in place of each layer's forward) runs the layer's projections, norm and output over the whole
packed step as transformers does, and between them, per sequence, the causal conv1d and the gated
delta rule with transformers' own torch functions, as `generate` calls them: a sequence's first
chunk from zero state (`causal_conv1d_fn`, the chunked rule), a later chunk from its slot's state,
one token with the single-step update (`causal_conv1d_update`, the recurrent rule). Decoding
sequences (one token each, with state) run as one batch. A prefix-cache hit cannot restore this
state, so a model with such layers runs without the prefix cache (`model_support`).
"""

from __future__ import annotations

import contextlib
import importlib
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# transformers' Gated DeltaNet modules whose forward this module replaces, by class name (the one
# implementation it was checked against; another family's layer of the same name is not assumed equal).
SERVED_LAYERS = {"Qwen3NextGatedDeltaNet": "transformers.models.qwen3_next.modeling_qwen3_next"}


@dataclass(frozen=True)
class Span:
    """Packed tokens [start, end) of the sequences in `slots` (several: decodes batched, one token each)."""

    start: int
    end: int
    slots: list[int]
    first: bool  # a first chunk: from zero state
    batched: bool  # one token per sequence, each from its state


def spans(num_computed: list[int], num_new: list[int], slots: list[int]) -> list[Span]:
    """A step's sequences (packed order) as spans: consecutive one-token decodes with state batched,
    every other sequence alone."""
    found: list[Span] = []
    offset = 0
    for p, n, s in zip(num_computed, num_new, slots, strict=True):
        last = found[-1] if found else None
        if n == 1 and p > 0 and last is not None and last.batched and last.end == offset:
            found[-1] = Span(last.start, offset + 1, [*last.slots, s], False, True)
        else:
            found.append(Span(offset, offset + n, [s], p == 0, n == 1 and p > 0))
        offset += n
    return found


class RecurrentState:
    """The slots of every served linear-attention layer of `model`, and its forwards."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.layers = [m for m in model.modules() if type(m).__name__ in SERVED_LAYERS]
        self.device = device
        self.conv: dict[int, torch.Tensor] = {}  # layer index -> [slots, conv_dim, kernel]
        self.recurrent: dict[int, torch.Tensor] = {}  # layer index -> [slots, v_heads, k_dim, v_dim]
        self.num_slots = 0
        self.spans: list[Span] | None = None  # this step's, set by `step`
        for layer in self.layers:
            ops = importlib.import_module(SERVED_LAYERS[type(layer).__name__])  # its torch functions
            layer.forward = types.MethodType(_layer_forward(self, ops), layer)

    def __bool__(self) -> bool:
        return bool(self.layers)

    def bytes_per_slot(self) -> int:
        """Bytes one sequence's state takes over all layers."""
        total = 0
        for layer in self.layers:
            dtype = layer.conv1d.weight.dtype
            total += layer.conv_dim * layer.conv_kernel_size * dtype.itemsize
            total += layer.num_v_heads * layer.head_k_dim * layer.head_v_dim * torch.float32.itemsize
        return total

    def allocate(self, num_slots: int) -> None:
        self.num_slots = num_slots
        for layer in self.layers:
            dtype = layer.conv1d.weight.dtype
            shape = (num_slots, layer.conv_dim, layer.conv_kernel_size)
            self.conv[layer.layer_idx] = torch.zeros(shape, dtype=dtype, device=self.device)
            shape = (num_slots, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim)
            self.recurrent[layer.layer_idx] = torch.zeros(shape, dtype=torch.float32, device=self.device)

    def copy_slots(self, pairs: list[tuple[int, int]]) -> None:
        """Copies each (source, destination) slot's state in every layer, in order (a fork's child
        gets its parent's)."""
        for source, destination in pairs:
            for pool in (*self.conv.values(), *self.recurrent.values()):
                pool[destination] = pool[source]

    def memory_bytes(self) -> int:
        return self.num_slots * self.bytes_per_slot()

    @contextlib.contextmanager
    def step(self, num_computed: list[int], num_new: list[int], slots: list[int]) -> Iterator[None]:
        """The forward of one step runs inside (sequences in packed order, each with its slot)."""
        if not self.layers:
            yield
            return
        assert all(0 <= s < self.num_slots for s in slots), f"state slots {slots} of {self.num_slots}"
        self.spans = spans(num_computed, num_new, slots)
        try:
            yield
        finally:
            self.spans = None


def _layer_forward(state: RecurrentState, ops: types.ModuleType):
    """A Gated DeltaNet layer's forward over the packed step [1, tokens, hidden] (transformers' own
    outside a step: the probe forward, with no cache)."""

    def forward(
        layer: nn.Module, hidden_states: torch.Tensor, *args: object, **kwargs: object
    ) -> torch.Tensor:
        if state.spans is None:
            return type(layer).forward(layer, hidden_states, *args, **kwargs)
        assert hidden_states.shape[0] == 1, "a packed step is one batch row"
        qkvz = layer.in_proj_qkvz(hidden_states)
        ba = layer.in_proj_ba(hidden_states)
        query, key, value, z, b, a = layer.fix_query_key_value_ordering(qkvz, ba)
        mixed = torch.cat([x.reshape(1, x.shape[1], -1) for x in (query, key, value)], dim=-1)
        mixed = torch.cat([_conv(layer, ops, state, mixed[0, s.start : s.end], s) for s in state.spans])
        query, key, value = torch.split(mixed[None], [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
        query = query.reshape(1, query.shape[1], -1, layer.head_k_dim)
        key = key.reshape(1, key.shape[1], -1, layer.head_k_dim)
        value = value.reshape(1, value.shape[1], -1, layer.head_v_dim)
        beta = b.sigmoid()
        g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)
        rows = (query, key, value, g, beta)
        out = torch.cat(
            [_delta_rule(layer, ops, state, [x[0, s.start : s.end] for x in rows], s) for s in state.spans]
        )
        shape = z.shape
        out = layer.norm(out.reshape(-1, out.shape[-1]), z.reshape(-1, z.shape[-1]))
        return layer.out_proj(out.reshape(shape).reshape(1, shape[1], -1))

    return forward


def _conv(
    layer: nn.Module, ops: types.ModuleType, state: RecurrentState, x: torch.Tensor, span: Span
) -> torch.Tensor:
    """The causal conv1d of one span's inputs `x` [tokens, conv_dim] -> [tokens, conv_dim], its slots'
    conv states read and written."""
    pool = state.conv[layer.layer_idx]
    weight = layer.conv1d.weight.squeeze(1)
    width = layer.conv_kernel_size
    if span.batched:  # one token per sequence: transformers' single-step update, batched
        conv = pool[span.slots]  # a copy, updated in place, written back
        out = ops.causal_conv1d_update(x[:, :, None], conv, weight, layer.conv1d.bias, layer.activation)
        pool[span.slots] = conv
        return out[:, :, 0]
    n = x.shape[0]
    slot = span.slots[0]
    inputs = x.T[None]  # [1, conv_dim, tokens]
    if span.first:  # as generate's prefill: padded to the kernel when shorter
        full = F.pad(inputs, (width - n, 0)) if n < width else inputs
    else:
        full = torch.cat([pool[slot : slot + 1], inputs], dim=-1)
    pool[slot] = full[0, :, -width:]
    out = ops.causal_conv1d_fn(full, weight, layer.conv1d.bias, activation=layer.activation)
    return out[0, :, -n:].T


def _delta_rule(
    layer: nn.Module, ops: types.ModuleType, state: RecurrentState, rows: list[torch.Tensor], span: Span
) -> torch.Tensor:
    """The gated delta rule over one span's rows (query, key, value, g, beta; each [tokens, ...]) ->
    [tokens, v_heads, v_dim], its slots' recurrent states read and written."""
    pool = state.recurrent[layer.layer_idx]
    if span.batched:  # one token per sequence: a batch of one-token sequences
        q, k, v, g, beta = (x[:, None] for x in rows)
        out, final = ops.torch_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=pool[span.slots], output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        pool[span.slots] = final
        return out[:, 0]
    q, k, v, g, beta = (x[None] for x in rows)
    slot = span.slots[0]
    initial = None if span.first else pool[slot : slot + 1]
    out, final = ops.torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    pool[slot] = final[0]
    return out[0]
