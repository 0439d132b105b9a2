"""Fused projections (`fuse_projections`, where the platform fuses: the CPU in fp32 and bf16): fewer
matrix multiplies per decoder layer, each by the projection's linear method (`worker/linear`).

At serving batch sizes (tens of tokens per step) a CPU decode step is many small matrix multiplies,
and each call costs about as much in fixed overhead as in arithmetic. Here, once at load:

- the projections that read the same input become one matrix multiply: q/k/v of every attention
  layer, gate/up of every MLP. Each keeps its own module (LoRA's forward hooks still see q_proj,
  k_proj, … with their input and their slice of the output, and add to it in place); the first
  member called computes the whole group's output, the others return their slice of it. A
  checkpoint that stores a group as one projection (Phi-3's `qkv_proj`, `gate_up_proj`) has that
  matrix multiply already: it is packed as it is;
- every such group, each other projection (o_proj, down_proj) and the LM head become a `Projection`
  of the linear method `linear.choose` picks for it (oneDNN-packed on this project's CPUs);
- the batched decode attention folds grouped-query heads into the query length (the runner tells
  its attention backend, `AttentionBackend.on_fused_projections`; the SDPA backend's `fold_gqa`),
  which avoids SDPA's slow GQA path on CPU (5x in bf16 at one query per sequence);
- where our C++ kernels run (`cpu_kernels`: built, AVX-512), every RMSNorm whose forward is
  transformers' Llama one and every SiLU MLP whose forward is Llama's (or Phi-3's) run one pass each
  (`csrc/cpu_layer_ops.cpp`) instead of torch's six and two: 2.5-4x on a prompt chunk's rows, 4x on
  a decode step's. In bf16 they are bitwise torch's; in fp32 a unit in the last place apart (the
  order of the sum of squares, the last bit of e^x).

Results: the folded attention differs from SDPA's GQA path by bf16 rounding (one unit in the last
place of some outputs, equally far from an fp32 reference), so bf16 greedy runs may part at
near-ties, as two batch sizes do (tests/worker/test_bfloat16.py's tolerance); the projections are
as exact as their method (`linear/onednn.py`). The model's other modules are untouched. The replaced
projections' own weights are dropped (the projection holds its own form of them); the LM head keeps
its weight (it may be tied to the input embeddings).
"""

from __future__ import annotations

import functools
import inspect
import types

import torch
from torch import nn
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
from transformers.models.phi3.modeling_phi3 import Phi3MLP

from tritonlm import platforms
from tritonlm.layer_names import layer_module
from tritonlm.worker import cpu_kernels
from tritonlm.worker import linear as linear_methods

GROUPS = {
    "self_attn": (("q_proj", "k_proj", "v_proj"), ("o_proj",)),
    "mlp": (("gate_proj", "up_proj"), ("down_proj",)),
}
# A group a checkpoint stores as one projection (Phi-3's): already one matrix multiply, packed as is.
PREFUSED = {"self_attn": "qkv_proj", "mlp": "gate_up_proj"}


class QuantizedLinear(nn.Module):
    """Stands in for an nn.Linear whose weight was loaded quantized (`quantized`, e.g. a GGUF file's
    4-bit blocks as an `Int4Weight`), until `fuse` groups it or `hold_quantized` gives it its own
    projection: it has the features and the bias, never a dense weight."""

    def __init__(self, weight: linear_methods.Weight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.quantized, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a quantized projection runs by its linear method: fused.hold_quantized")


Linear = nn.Linear | QuantizedLinear  # what a projection is before it gets its method


def _weight(linear: Linear) -> linear_methods.Weight:
    return linear.quantized if isinstance(linear, QuantizedLinear) else linear.weight.detach()


class PackedLinear(nn.Module):
    """Stands in for one nn.Linear (same features, same forward hooks), computed by its `projection`."""

    def __init__(self, name: str, linear: Linear, keep_weight: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach()
        self.projection = linear_methods.prepare(name, _weight(linear), bias)
        if keep_weight:  # e.g. the LM head, whose weight others read (tied embeddings, vocab size)
            self.weight = linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x)


class _Group:
    """The projections that read one input: one matrix multiply for all, cached for the others."""

    def __init__(self, name: str, linears: list[Linear]) -> None:
        weights = [_weight(m) for m in linears]
        weight = torch.cat(weights) if isinstance(weights[0], torch.Tensor) else type(weights[0]).cat(weights)
        biases = [m.bias for m in linears]
        bias = None
        if any(b is not None for b in biases):
            given = next(b for b in biases if b is not None)
            bias = torch.cat(
                [
                    b.detach() if b is not None else given.new_zeros(m.out_features)
                    for m, b in zip(linears, biases, strict=True)
                ]
            )
        self.projection = linear_methods.prepare(name, weight, bias)
        bounds = [0]
        for m in linears:
            bounds.append(bounds[-1] + m.out_features)
        self.spans = list(zip(bounds, bounds[1:], strict=False))
        self.input: torch.Tensor | None = None
        self.output: torch.Tensor | None = None
        self.left = 0  # members still to take their slice of `output`

    def slice(self, member: int, x: torch.Tensor) -> torch.Tensor:
        # The members are called one after the other on the same tensor (q, k, v; gate, up).
        if self.input is not x or self.left == 0:
            self.input, self.output = x, self.projection(x)
            self.left = len(self.spans)
        a, b = self.spans[member]
        out = self.output[..., a:b]
        self.left -= 1
        if self.left == 0:  # all served: hold nothing between steps
            self.input = self.output = None
        return out


class GroupMember(nn.Module):
    """One projection of a `_Group`, in place of its nn.Linear (same features, same hooks)."""

    def __init__(self, linear: Linear, group: _Group, member: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group, self.member = group, member

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.slice(self.member, x)


@functools.cache
def same_forward(kind: type[nn.Module], reference: type[nn.Module]) -> bool:
    """Whether `kind`'s forward is `reference`'s, by source (transformers copies Llama's into
    Qwen2, Qwen3, Mistral, …; a class with another formula, e.g. Gemma's 1 + weight, differs)."""
    if kind.forward is reference.forward:
        return True
    try:
        return inspect.getsource(kind.forward) == inspect.getsource(reference.forward)
    except (OSError, TypeError):
        return False


class FusedRMSNorm(nn.Module):
    """Stands in for a Llama-style RMSNorm: one pass per row (`rms_norm`)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(rows)
        cpu_kernels.kernels().rms_norm(out, rows, self.weight, self.variance_epsilon, True)
        return out.view(x.shape)


def silu_mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Llama's MLP, its SiLU and product in one pass (`silu_and_mul`) over the (fused) gate and up
    projections' outputs."""
    gate, up = self.gate_proj(x), self.up_proj(x)
    hidden = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    width = gate.shape[-1]
    cpu_kernels.kernels().silu_and_mul(
        hidden.view(-1, width), gate.reshape(-1, width), up.reshape(-1, width), True
    )
    return self.down_proj(hidden)


def silu_gate_up_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Phi-3's MLP (gate and up as one projection, gate first), its SiLU and product in one pass."""
    gate_up = self.gate_up_proj(x)
    width = gate_up.shape[-1] // 2
    hidden = torch.empty((*gate_up.shape[:-1], width), dtype=gate_up.dtype, device=gate_up.device)
    rows = gate_up.reshape(-1, 2 * width)
    cpu_kernels.kernels().silu_and_mul(hidden.view(-1, width), rows[:, :width], rows[:, width:], True)
    return self.down_proj(hidden)


def _fuse_layer_ops(model: nn.Module) -> int:
    """Swaps in the one-pass RMSNorm and SiLU-and-mul where our kernels run; returns how many."""
    if cpu_kernels.unavailable() is not None:
        return 0
    swapped = 0
    for name, module in list(model.named_modules()):
        if same_forward(type(module), LlamaRMSNorm) and module.weight.dtype == model.dtype:
            parent, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(parent), attribute, FusedRMSNorm(module))
            swapped += 1
        elif same_forward(type(module), LlamaMLP) and isinstance(module.act_fn, (nn.SiLU, SiLUActivation)):
            module.forward = types.MethodType(silu_mlp_forward, module)
            swapped += 1
        elif same_forward(type(module), Phi3MLP) and isinstance(
            module.activation_fn, (nn.SiLU, SiLUActivation)
        ):
            module.forward = types.MethodType(silu_gate_up_forward, module)
            swapped += 1
    return swapped


def fuse(model: nn.Module) -> int:
    """Replaces the decoder layers' projections and the LM head of `model` (where its platform fuses)
    as above; returns how many attention and MLP blocks it fused (0: the model is left as it was).
    Tests run it on transformers' own model to compare the engine's logits with those of the same
    projections."""
    if not platforms.of(model.device).fuses_projections(model.dtype):
        return 0
    fused = 0
    for name, block in list(model.named_modules()):
        match = layer_module(name)
        if not match or match.projection:
            continue
        grouped, single = GROUPS[match.block]
        linears = [getattr(block, n, None) for n in grouped]
        prefused = PREFUSED[match.block]
        if _same_kind(linears):
            group = _Group(f"{name}.{'_'.join(grouped)}", linears)
            for i, n in enumerate(grouped):
                setattr(block, n, GroupMember(linears[i], group, i))
        elif type(getattr(block, prefused, None)) in (nn.Linear, QuantizedLinear):
            setattr(block, prefused, PackedLinear(f"{name}.{prefused}", getattr(block, prefused)))
        else:
            continue  # another layout (e.g. GPT-2's c_attn), or dense and quantized members: left
        for n in single:
            if type(getattr(block, n, None)) in (nn.Linear, QuantizedLinear):
                setattr(block, n, PackedLinear(f"{name}.{n}", getattr(block, n)))
        fused += 1
    head = model.get_output_embeddings()
    if fused and type(head) is nn.Linear:
        model.set_output_embeddings(PackedLinear("lm_head", head, keep_weight=True))
    if fused:
        _fuse_layer_ops(model)
    return fused


def _same_kind(linears: list[nn.Module | None]) -> bool:
    """Whether one matrix multiply can compute them all: projections of one input, their weights
    all dense or all of one quantized form."""
    if any(type(m) not in (nn.Linear, QuantizedLinear) for m in linears):
        return False
    forms = {type(_weight(m)) for m in linears}
    return len(forms) == 1 and len({m.in_features for m in linears}) == 1


def hold_quantized(model: nn.Module) -> int:
    """Gives every quantized projection `fuse` did not group (fusion off, a mixed group, another
    layout) its own projection; returns how many."""
    held = 0
    for name, module in list(model.named_modules()):
        if type(module) is QuantizedLinear:
            parent, _, attribute = name.rpartition(".")
            setattr(model.get_submodule(parent), attribute, PackedLinear(name, module))
            held += 1
    return held
