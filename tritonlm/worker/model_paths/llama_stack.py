"""`llama_stack`: the CPU fast path of Llama (`LlamaForCausalLM`): its decoder stack run straight over
its fused modules (`fuse_projections`), the model's forward without transformers' module calls.

Through transformers' modules a decoder layer is about 120 operator calls (views, transposes,
rotate_half's slices and cat, hooks, keyword plumbing); in a CPU decode step of a small model they
cost as much as a fifth of the step, more while serving shares the cores. Here a layer is nine:

    q/k/v projection → rotary (query and key heads in place) → the attention backend's `forward`
    → o projection → residual add + RMSNorm → gate/up projection → SiLU-and-mul
    → down projection → residual add + RMSNorm (the next layer's input norm, or the final one)

on the same modules and weights: `fused`'s projections (by their linear methods), the backend's
`forward` (the seam is unchanged: it writes the layer's keys and values and attends), and the C++
kernels (`rotary`, `add_rms_norm`, `silu_and_mul`), which round where transformers rounds, so the
logits are those of the module path bitwise (tests/worker/test_llama_stack.py). The final norm and
the LM head run on the rows whose logits are kept only.

`LlamaStack.build` builds one only for a model that is Llama's exactly: the forwards of its classes
are Llama's by source (`fused.same_forward`), every projection and norm was fused and the kernels run
here; otherwise it says why, and the model runs through transformers (`generic.py`). The runner uses
it for steps without LoRA adapters, whose hooks sit on the projection modules this path does not call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.models.llama import modeling_llama as llama

from tritonlm.platforms.base import Platform
from tritonlm.worker import cpu_kernels, fused
from tritonlm.worker.attention.base import AttentionBackend
from tritonlm.worker.linear import Projection
from tritonlm.worker.model_paths.base import ForwardInputs, ModelPath


@dataclass
class _Norm:
    weight: torch.Tensor
    eps: float


@dataclass
class _Layer:
    attention: nn.Module  # the backend reads its layer_idx
    scaling: float
    heads: int
    kv_heads: int
    head_dim: int
    qkv: Projection
    o: Projection
    post_attention_norm: _Norm
    gate_up: Projection
    down: Projection


def _norm(module: nn.Module) -> _Norm | None:
    return _Norm(module.weight, module.variance_epsilon) if isinstance(module, fused.FusedRMSNorm) else None


def _group(members: list[nn.Module]) -> Projection | None:
    """The one matrix multiply of `members`, when they are a fused group's members in order."""
    if not all(isinstance(m, fused.GroupMember) for m in members):
        return None
    group = members[0].group
    in_order = all(m.group is group and m.member == i for i, m in enumerate(members))
    if not in_order or len(group.spans) != len(members):
        return None
    return group.projection


def _layer(layer: nn.Module) -> _Layer | None:
    attention, mlp = layer.self_attn, layer.mlp
    if not (
        fused.same_forward(type(layer), llama.LlamaDecoderLayer)
        and fused.same_forward(type(attention), llama.LlamaAttention)
        and fused.same_forward(type(mlp), llama.LlamaMLP)
        and getattr(mlp.forward, "__func__", None) is fused.silu_mlp_forward
    ):
        return None
    qkv = _group([attention.q_proj, attention.k_proj, attention.v_proj])
    gate_up = _group([mlp.gate_proj, mlp.up_proj])
    norm = _norm(layer.post_attention_layernorm)
    if None in (qkv, gate_up, norm) or not all(
        isinstance(m, fused.PackedLinear) for m in (attention.o_proj, mlp.down_proj)
    ):
        return None
    dim = attention.head_dim
    return _Layer(
        attention,
        attention.scaling,
        attention.q_proj.out_features // dim,
        attention.k_proj.out_features // dim,
        dim,
        qkv,
        attention.o_proj.projection,
        norm,
        gate_up,
        mlp.down_proj.projection,
    )


class LlamaStack(ModelPath):
    name = "llama_stack"

    def __init__(
        self,
        model: nn.Module,
        attention: AttentionBackend,
        layers: list[_Layer],
        input_norms: list[_Norm],
        final_norm: _Norm,
    ) -> None:
        self.embed = model.model.embed_tokens
        self.rotary = model.model.rotary_emb
        self.head = model.lm_head.projection
        self.attention = attention
        self.layers = layers
        # The norm after each layer's MLP: the next layer's input norm, the final one after the last.
        self.input_norm = input_norms[0]
        self.next_norms = [*input_norms[1:], final_norm]
        self.ops = cpu_kernels.kernels()

    @classmethod
    def build(cls, model: nn.Module, attention: AttentionBackend, platform: Platform) -> ModelPath | str:
        """The stack of `model` (fused by `fused.fuse`), or why it is not exactly Llama's fused."""
        why = cpu_kernels.unavailable()
        if why is not None:
            return why
        if not (
            fused.same_forward(type(model), llama.LlamaForCausalLM)
            and fused.same_forward(type(model.model), llama.LlamaModel)
            and fused.same_forward(type(model.model.rotary_emb), llama.LlamaRotaryEmbedding)
            and type(model.model.embed_tokens) is nn.Embedding
        ):
            return f"{type(model).__name__} is not Llama's modules"
        if not isinstance(model.lm_head, fused.PackedLinear):
            return "its projections are not fused (fuse_projections)"
        layers = [_layer(layer) for layer in model.model.layers]
        norms = [_norm(layer.input_layernorm) for layer in model.model.layers]
        final = _norm(model.model.norm)
        if not layers or None in layers or None in norms or final is None:
            return "a layer is not Llama's fused layer"
        return cls(model, attention, layers, norms, final)

    def __call__(self, inputs: ForwardInputs) -> torch.Tensor:
        """`ModelPath.__call__`, for steps without adapters; `inputs.embeds` is consumed (the
        residual stream is summed into it)."""
        input_ids, embeds, positions, keep = inputs.input_ids, inputs.embeds, inputs.positions, inputs.keep
        residual = self.embed(input_ids) if embeds is None else embeds
        cos, sin = (t[0] for t in self.rotary(residual[None], positions[None]))
        x = torch.empty_like(residual)
        self.ops.rms_norm(x, residual, self.input_norm.weight, self.input_norm.eps, True)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            out = self._attention(layer, x, cos, sin)
            self._add_norm(x, residual, out, layer.post_attention_norm)
            out = self._mlp(layer, x)
            if i == last and len(keep) != residual.shape[0]:  # only the kept rows go on
                kept = torch.tensor(keep, dtype=torch.long)
                residual, out, x = residual[kept], out[kept], x[kept]
            self._add_norm(x, residual, out, self.next_norms[i])
        return self.head(x)

    def _add_norm(self, out: torch.Tensor, residual: torch.Tensor, x: torch.Tensor, norm: _Norm) -> None:
        self.ops.add_rms_norm(out, residual, x, norm.weight, norm.eps, True)

    def _attention(
        self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        tokens, dim = x.shape[0], layer.head_dim
        heads = layer.heads + 2 * layer.kv_heads
        qkv = layer.qkv(x).view(tokens, heads, dim)
        self.ops.rotary(qkv[:, : layer.heads + layer.kv_heads], cos, sin, True)
        # The backend takes transformers' [1, heads, tokens, head_dim] (views here).
        query, key, value = (
            part.transpose(0, 1)[None]
            for part in qkv.split([layer.heads, layer.kv_heads, layer.kv_heads], dim=1)
        )
        out = self.attention.forward(layer.attention, query, key, value, layer.scaling)
        return layer.o(out.reshape(tokens, -1))

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate_up = layer.gate_up(x)
        width = gate_up.shape[1] // 2
        hidden = torch.empty((x.shape[0], width), dtype=x.dtype)
        self.ops.silu_and_mul(hidden, gate_up[:, :width], gate_up[:, width:], True)
        return layer.down(hidden)
