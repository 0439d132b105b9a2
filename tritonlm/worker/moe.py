"""Which experts implementation runs a mixture-of-experts model (`moe_implementation`), handed to
`from_pretrained` at load, and our own: `grouped_linear`.

transformers' MoE families (Qwen3-MoE, Mixtral, gpt-oss, …) hold their experts as 3D weights and
dispatch the experts' forward by name (`transformers.integrations.moe`): `grouped_mm` sorts the
token-expert pairs by expert and runs each projection as one grouped matmul (torch's
`grouped_mm`); `eager` loops over the experts hit; `batched_mm` gathers every pair's expert
weights. `grouped_linear` groups the pairs by expert as `grouped_mm` does, then runs each expert's
two projections on its rows through the linear methods (`worker/linear`: oneDNN pre-packed on the
CPU), the form a small matrix multiply is fastest in there: about 1.5x `grouped_mm`'s experts at a
32-sequence decode step (docs/benchmarks.md). So `auto` names it on the CPU and `grouped_mm`
elsewhere (it loops in Python over the experts, which a GPU would wait on)."""

from __future__ import annotations

import torch
from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoModelForCausalLM, PretrainedConfig
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, grouped_mm_experts_forward

from tritonlm.worker import linear

GROUPED_LINEAR = "grouped_linear"


def experts_implementation(
    name: str, model_class: type, checkpoint: PretrainedConfig, device_type: str
) -> str | None:
    """The `experts_implementation` to load `model_class` with: None (transformers' own, which a
    model without switchable experts ignores) where the model's experts cannot switch."""
    if model_class is AutoModelForCausalLM:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(checkpoint), model_class)
    # transformers' own test: the model's module decorates its experts with the interface.
    can_switch = getattr(model_class, "_can_set_experts_implementation", None)
    if can_switch is None or not can_switch():
        return None
    if name == "auto":
        return GROUPED_LINEAR if device_type == "cpu" else "grouped_mm"
    return name


def grouped_linear_forward(
    self: torch.nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """transformers' experts forward (`hidden` [tokens, hidden], each token's top-k experts and
    routing weights) with the pairs sorted by expert and each expert's rows through its projections."""
    if self._is_expert_parallel:  # sentinel expert ids, which transformers' grouped_mm masks
        return grouped_mm_experts_forward(self, hidden, top_k_index, top_k_weights)
    projections = _projections(self)
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    rows = hidden[token]
    out = rows.new_empty(rows.shape[0], projections[0][1].out_features)
    activate = self._apply_gate if self.has_gate else self.act_fn
    start = 0
    # One host sync for the group sizes, then each expert hit on its contiguous rows.
    for expert, n in enumerate(torch.bincount(flat, minlength=self.num_experts).tolist()):
        if n:
            up, down = projections[expert]
            out[start : start + n] = down(activate(up(rows[start : start + n])))
            start += n
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    weighted = out * top_k_weights.reshape(-1)[order, None].to(out.dtype)
    # Summed in float32 and rounded once, as grouped_mm's per-token sum does.
    summed = hidden.new_zeros((hidden.shape[0], out.shape[1]), dtype=torch.float32)
    return summed.index_add_(0, token, weighted.float()).to(hidden.dtype)


def _projections(experts: torch.nn.Module) -> list[tuple[linear.Projection, linear.Projection]]:
    """Each expert's (gate-and-up or up, down) projections, made on the first forward; the 3D
    weights they replace are emptied (a packed copy beside them would double the experts' memory)."""
    made = experts.__dict__.get("_tritonlm_projections")
    if made is not None:
        return made
    names = ("gate_up_proj" if experts.has_gate else "up_proj", "down_proj")
    made = []
    for e in range(experts.num_experts):
        pair = []
        for name in names:
            weight = getattr(experts, name)[e]
            weight = weight.t() if experts.is_transposed else weight  # linear's [out, in]
            bias = getattr(experts, f"{name}_bias")[e] if experts.has_bias else None
            pair.append(linear.prepare(f"experts.{e}.{name}", weight.contiguous(), bias))
        made.append(tuple(pair))
    for name in names:
        param = getattr(experts, name)
        param.data = param.data.new_empty(0)
    experts.__dict__["_tritonlm_projections"] = made
    return made


ALL_EXPERTS_FUNCTIONS.register(GROUPED_LINEAR, grouped_linear_forward)
