"""`decoder_stack`: the CPU fast path of the dense decoders shaped like Llama (Llama, Qwen2, Qwen3,
Mistral, Granite, Phi-3): their decoder stack run straight over the fused modules (`fuse_projections`), the
model's forward without transformers' module calls.

Through transformers' modules a decoder layer is about 120 operator calls (views, transposes,
rotate_half's slices and cat, hooks, keyword plumbing); in a CPU decode step of a small model they
cost as much as a fifth of the step, more while serving shares the cores. Here a layer is nine:

    q/k/v projection → rotary (query and key heads in place) → the attention backend's `forward`
    → o projection → residual add + RMSNorm → gate/up projection → SiLU-and-mul
    → down projection → residual add + RMSNorm (the next layer's input norm, or the final one)

on the same modules and weights (at a decode step, all of it one C++ call where the layers fit
it: `layers_call.py`): `fused`'s projections (by their linear methods, q/k/v biases
included), the backend's `forward` (the seam is unchanged: it writes the layer's keys and values and
attends, a sliding window or other rule by the layer's own `LayerRule`), and the C++ kernels
(`rotary`, `add_rms_norm`, `silu_and_mul`), which round where transformers rounds, so the logits are
those of the module path bitwise (tests/worker/test_decoder_stack.py). The final norm and the LM head
run on the rows whose logits are kept only.

What a family adds to that layer is data (`Family`, one per family in `FAMILIES`): Qwen3's RMSNorm of
each query and key head before the rotary embedding (`qk_norm`), Granite's multipliers of the
embeddings, of each block's output and of the logits (`multipliers`), Phi-3's q/k/v and gate/up
stored as one projection each (`packed`) and its partial rotary embedding. A model is recognised by its
classes, never by its name: `DecoderStack.build` takes the family whose transformers classes have the
forwards of the model's by source (`fused.same_forward`), every projection and norm fused and the
kernels running here; otherwise it says why, and the model runs through transformers (`generic.py`).
The runner uses it for steps without LoRA adapters, whose hooks sit on the projection modules this
path does not call.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from tritonlm.platforms.base import Platform
from tritonlm.worker import cpu_kernels, fused
from tritonlm.worker.attention.base import FEATURES, NOTHING, AttentionBackend
from tritonlm.worker.linear import Projection
from tritonlm.worker.model_paths.base import ForwardInputs, ModelPath
from tritonlm.worker.model_paths.layers_call import LayersCall
from tritonlm.worker.model_paths.stack_layer import StackLayer, StackNorm

# The module classes a family's forward is made of, by transformers' suffix.
PARTS = ("ForCausalLM", "Model", "DecoderLayer", "Attention", "RotaryEmbedding")


@dataclass(frozen=True)
class Family:
    """A decoder family the stack runs: transformers' `modeling_<module>` classes `<prefix><part>`
    (`PARTS`; `fused` recognises the norms and MLPs it runs on the kernels), and what its layer adds
    to Llama's."""

    module: str
    prefix: str
    qk_norm: bool = False  # q_norm, k_norm: an RMSNorm of each query and key head before rotary
    packed: bool = False  # qkv_proj, gate_up_proj: the checkpoint's own fused projections (Phi-3)
    multipliers: bool = False  # embedding_multiplier, residual_multiplier, logits_scaling (Granite)

    def classes(self) -> dict[str, type[nn.Module]]:
        modeling: ModuleType = importlib.import_module(
            f"transformers.models.{self.module}.modeling_{self.module}"
        )
        return {part: getattr(modeling, self.prefix + part) for part in PARTS}

    def matches(self, model: nn.Module) -> bool:
        """Whether `model`'s classes have this family's forwards (by source)."""
        ours = self.classes()
        inner = model.model
        layers = list(inner.layers)
        given = {
            "ForCausalLM": [type(model)],
            "Model": [type(inner)],
            "RotaryEmbedding": [type(inner.rotary_emb)],
            "DecoderLayer": [type(layer) for layer in layers],
            "Attention": [type(layer.self_attn) for layer in layers],
        }
        return all(fused.same_forward(kind, ours[part]) for part, kinds in given.items() for kind in kinds)


# Llama's layer plus what each family adds; the first whose classes match is the model's.
FAMILIES = (
    Family("llama", "Llama"),
    Family("qwen2", "Qwen2"),  # q/k/v biases: in the fused projection; sliding layers: the backend's
    Family("mistral", "Mistral"),  # its sliding window: the backend's (LayerRule)
    Family("qwen3", "Qwen3", qk_norm=True),
    Family("granite", "Granite", multipliers=True),
    # its partial rotary embedding (partial_rotary_factor) rotates the first dimensions of each head
    Family("phi3", "Phi3", packed=True),
)


@dataclass(frozen=True)
class _Scales:
    """Granite's multipliers (`Family.multipliers`); Llama's are all 1."""

    embedding: float = 1.0
    residual: float = 1.0
    logits: float = 1.0


def _norm(module: nn.Module) -> StackNorm | None:
    if not isinstance(module, fused.FusedRMSNorm):
        return None
    return StackNorm(module.weight, module.variance_epsilon)


def _group(members: list[nn.Module]) -> Projection | None:
    """The one matrix multiply of `members`, when they are a fused group's members in order."""
    if not all(isinstance(m, fused.GroupMember) for m in members):
        return None
    group = members[0].group
    in_order = all(m.group is group and m.member == i for i, m in enumerate(members))
    if not in_order or len(group.spans) != len(members):
        return None
    return group.projection


def _packed(module: nn.Module) -> Projection | None:
    return module.projection if isinstance(module, fused.PackedLinear) else None


def _projections(attention: nn.Module, mlp: nn.Module, family: Family) -> tuple[Projection | None, ...]:
    """The layer's q/k/v and gate/up matrix multiplies, when its MLP is a SiLU one."""
    if family.packed:  # Phi-3's: gate then up in one output, SiLU of the gate times up
        if getattr(mlp.forward, "__func__", None) is not fused.silu_gate_up_forward:
            return None, None
        return _packed(attention.qkv_proj), _packed(mlp.gate_up_proj)
    if getattr(mlp.forward, "__func__", None) is not fused.silu_mlp_forward:
        return None, None
    return _group([attention.q_proj, attention.k_proj, attention.v_proj]), _group(
        [mlp.gate_proj, mlp.up_proj]
    )


def _layer(layer: nn.Module, family: Family) -> StackLayer | None:
    """The layer's fused parts, or None when one is not (e.g. an MLP whose act is not SiLU)."""
    attention, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = _projections(attention, mlp, family)
    norm = _norm(layer.post_attention_layernorm)
    q_norm = k_norm = None
    if family.qk_norm and None in (q_norm := _norm(attention.q_norm), k_norm := _norm(attention.k_norm)):
        return None
    if None in (qkv, gate_up, norm) or not all(
        isinstance(m, fused.PackedLinear) for m in (attention.o_proj, mlp.down_proj)
    ):
        return None
    return StackLayer(
        attention,
        attention.scaling,
        attention.config.num_attention_heads,
        attention.config.num_key_value_heads,
        attention.head_dim,
        qkv,
        attention.o_proj.projection,
        norm,
        gate_up,
        mlp.down_proj.projection,
        q_norm,
        k_norm,
    )


def family_of(model: nn.Module) -> Family | None:
    """The family whose forwards `model`'s classes have, or None."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return None
    return next((family for family in FAMILIES if family.matches(model)), None)


class DecoderStack(ModelPath):
    name = "decoder_stack"

    def __init__(
        self,
        model: nn.Module,
        family: Family,
        attention: AttentionBackend,
        layers: list[StackLayer],
        input_norms: list[StackNorm],
        final_norm: StackNorm,
        scales: _Scales,
    ) -> None:
        self.family = family
        self.embed = model.model.embed_tokens
        self.rotary = model.model.rotary_emb
        self.head = model.lm_head.projection
        self.attention = attention
        self.layers = layers
        # The norm after each layer's MLP: the next layer's input norm, the final one after the last.
        self.input_norm = input_norms[0]
        self.next_norms = [*input_norms[1:], final_norm]
        self.scales = scales
        self.ops = cpu_kernels.kernels()
        self._handed: list[Mapping[str, object]] | None = None  # each layer's, after the probe
        # A decode step's layers as one C++ call where they fit it (else None: the loop below).
        call = LayersCall.build(layers, self.next_norms, scales.residual, attention)
        self.layers_call = call if isinstance(call, LayersCall) else None
        self.layers_call_refused = call if isinstance(call, str) else None

    @classmethod
    def build(cls, model: nn.Module, attention: AttentionBackend, platform: Platform) -> ModelPath | str:
        """The stack of `model` (fused by `fused.fuse`), or why it is not a family's fused model."""
        why = cpu_kernels.unavailable()
        if why is not None:
            return why
        family = family_of(model)
        if family is None:
            names = ", ".join(f.prefix for f in FAMILIES)
            return f"{type(model).__name__} does not have the modules of {names}"
        if type(model.model.embed_tokens) is not nn.Embedding:
            return f"{type(model.model.embed_tokens).__name__} is not an nn.Embedding"
        if not isinstance(model.lm_head, fused.PackedLinear):
            return "its projections are not fused (fuse_projections)"
        layers = [_layer(layer, family) for layer in model.model.layers]
        norms = [_norm(layer.input_layernorm) for layer in model.model.layers]
        final = _norm(model.model.norm)
        if not layers or None in layers or None in norms or final is None:
            return f"a layer is not {family.prefix}'s fused layer (its projections, norms, SiLU MLP)"
        scales = _scales(model, family)
        if isinstance(scales, str):
            return scales
        return cls(model, family, attention, layers, norms, final, scales)

    def __call__(self, inputs: ForwardInputs) -> torch.Tensor:
        """`ModelPath.__call__`, for steps without adapters; `inputs.embeds` is consumed (the
        residual stream is summed into it)."""
        input_ids, embeds, positions, keep = inputs.input_ids, inputs.embeds, inputs.positions, inputs.keep
        residual = self.embed(input_ids) if embeds is None else embeds
        scales = self.scales
        if scales.embedding != 1.0:
            residual = residual * scales.embedding  # Granite's, as its model computes it
        cos, sin = (t[0] for t in self.rotary(residual[None], positions[None]))
        x = torch.empty_like(residual)
        self.ops.rms_norm(x, residual, self.input_norm.weight, self.input_norm.eps, True)
        if self.layers_call is not None and self.layers_call.runs(x.shape[0], keep):
            self.layers_call(x, residual, cos, sin)
            return self._logits(x)
        last = len(self.layers) - 1
        handed = self._layer_kwargs()
        for i, layer in enumerate(self.layers):
            out = self._attention(layer, x, cos, sin, handed[i])
            self._add_norm(x, residual, out, layer.post_attention_norm)
            out = self._mlp(layer, x)
            if i == last and len(keep) != residual.shape[0]:  # only the kept rows go on
                kept = torch.tensor(keep, dtype=torch.long)
                residual, out, x = residual[kept], out[kept], x[kept]
            self._add_norm(x, residual, out, self.next_norms[i])
        return self._logits(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        return logits if self.scales.logits == 1.0 else logits / self.scales.logits

    def _layer_kwargs(self) -> list[Mapping[str, object]]:
        """What each layer hands the backend beyond q, k, v and scaling (a window, sinks: `FEATURES`),
        as transformers handed it in the runner's probe forward (which runs after `build`)."""
        if self._handed is None:
            handed = self.attention.handed
            self._handed = [
                {
                    k: v
                    for k, v in handed.get(layer.attention.layer_idx, NOTHING).items()
                    if k in FEATURES.values()
                }
                or NOTHING
                for layer in self.layers
            ]
        return self._handed

    def _add_norm(self, out: torch.Tensor, residual: torch.Tensor, x: torch.Tensor, norm: StackNorm) -> None:
        if self.scales.residual != 1.0:
            x = x * self.scales.residual  # Granite's: rounded before the sum, as its layer does
        self.ops.add_rms_norm(out, residual, x, norm.weight, norm.eps, True)

    def _attention(
        self,
        layer: StackLayer,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        handed: Mapping[str, object],
    ) -> torch.Tensor:
        tokens, dim, heads, kv_heads = x.shape[0], layer.head_dim, layer.heads, layer.kv_heads
        qkv = layer.qkv(x).view(tokens, heads + 2 * kv_heads, dim)
        rotated = cos.shape[1]  # head_dim, or its first part (Phi-3's partial_rotary_factor)
        if layer.q_norm is None:
            self.ops.rotary(qkv[:, : heads + kv_heads, :rotated], cos, sin, True)
            query, key, value = qkv.split([heads, kv_heads, kv_heads], dim=1)
        else:
            query = self._head_norm(qkv[:, :heads], layer.q_norm)
            key = self._head_norm(qkv[:, heads : heads + kv_heads], layer.k_norm)
            self.ops.rotary(query[..., :rotated], cos, sin, True)
            self.ops.rotary(key[..., :rotated], cos, sin, True)
            value = qkv[:, heads + kv_heads :]
        # The backend takes transformers' [1, heads, tokens, head_dim] (views here).
        query, key, value = (part.transpose(0, 1)[None] for part in (query, key, value))
        out = self.attention.forward(layer.attention, query, key, value, layer.scaling, handed)
        return layer.o(out.reshape(tokens, -1))

    def _head_norm(self, heads: torch.Tensor, norm: StackNorm) -> torch.Tensor:
        """Each head [tokens, heads, head_dim] RMS-normalised into a tensor of its own."""
        out = torch.empty(heads.shape, dtype=heads.dtype)
        dim = heads.shape[2]
        self.ops.rms_norm(out.view(-1, dim), heads.reshape(-1, dim), norm.weight, norm.eps, True)
        return out

    def _mlp(self, layer: StackLayer, x: torch.Tensor) -> torch.Tensor:
        gate_up = layer.gate_up(x)
        width = gate_up.shape[1] // 2
        hidden = torch.empty((x.shape[0], width), dtype=x.dtype)
        self.ops.silu_and_mul(hidden, gate_up[:, :width], gate_up[:, width:], True)
        return layer.down(hidden)


def _scales(model: nn.Module, family: Family) -> _Scales | str:
    """The family's multipliers, or why the stack does not apply them (layers that differ)."""
    if not family.multipliers:
        return _Scales()
    residuals = {layer.residual_multiplier for layer in model.model.layers}
    if len(residuals) != 1:
        return f"its layers' residual_multiplier differ ({sorted(residuals)})"
    return _Scales(model.model.embedding_multiplier, residuals.pop(), model.config.logits_scaling)
