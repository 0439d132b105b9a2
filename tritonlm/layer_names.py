"""Where a transformers decoder keeps its layers' projections: the modules
`…layers.<i>.self_attn.<q|k|v|o>_proj` and `…layers.<i>.mlp.<gate|up|down>_proj` (Llama's layout,
shared by most decoders). The CPU fast path's fusing (worker/fused.py), LoRA's hooks (lora/layers.py)
and PEFT's weight keys (lora/format.py) all find them by this one rule."""

from __future__ import annotations

import re
from typing import NamedTuple

_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)(?:\.(\w+))?$")


class LayerModule(NamedTuple):
    layer: int
    block: str  # "self_attn" or "mlp"
    projection: str | None  # e.g. "q_proj"; None: the block itself


def layer_module(name: str) -> LayerModule | None:
    """What the module called `name` (as `named_modules` names it) is in its decoder layer: a block,
    or a module of one; None for anything else."""
    match = _NAME.search(name)
    return match and LayerModule(int(match.group(1)), match.group(2), match.group(3))
