"""A decoder stack's layer as the stack holds it (`decoder_stack.py`): its fused parts, which the
stack's loop and its one call (`layers_call.py`) both read."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tritonlm.worker.linear import Projection


@dataclass
class StackNorm:
    weight: torch.Tensor
    eps: float


@dataclass
class StackLayer:
    attention: nn.Module  # the backend reads its layer_idx
    scaling: float
    heads: int
    kv_heads: int
    head_dim: int
    qkv: Projection
    o: Projection
    post_attention_norm: StackNorm
    gate_up: Projection
    down: Projection
    q_norm: StackNorm | None = None  # `Family.qk_norm`
    k_norm: StackNorm | None = None
