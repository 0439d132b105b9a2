"""Platforms: where the engine runs (`cpu`, `cuda`), decided in one place.

A `Platform` (`base.py`) answers every question that depends on the device: what `device` and
`dtype` `auto` mean, the engine's threads, the memory the KV cache may size itself from, which
attention backends exist there, whether projections are fused and packed, and how a step's host
tensors reach the device. `PLATFORMS` names them; `of(device)` gives the one for a `torch.device`,
`resolve(setting)` the one a `device` setting (`auto`, `cpu`, `cuda`, `cuda:N`) picks. Nothing here
imports torch until a platform is asked for, so settings checks stay torch-free.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from tritonlm.platforms.base import Platform

AUTO = "auto"
# The KV cache's share of free memory when `kv_cache_memory_fraction` is 0 (unset), by platform: a
# GPU holds little else; on a CPU the cache shares the machine's memory with everything else.
KV_MEMORY_FRACTION = {"cuda": 0.9, "cpu": 0.2}
# device type -> "module:class" of its Platform.
PLATFORMS = {
    "cpu": "tritonlm.platforms.cpu:CpuPlatform",
    "cuda": "tritonlm.platforms.cuda:CudaPlatform",
}


def platform_class(device_type: str) -> type[Platform]:
    if device_type not in PLATFORMS:
        raise ValueError(f"device: no platform for {device_type!r}; known: {', '.join(PLATFORMS)}")
    module, _, cls = PLATFORMS[device_type].partition(":")
    return getattr(importlib.import_module(module), cls)


def resolve_device(setting: str) -> torch.device:
    """The device a `device` setting names; `auto` (or empty): CUDA when torch sees a GPU, else CPU."""
    import torch

    if setting in ("", AUTO):
        return torch.device("cuda" if platform_class("cuda").unavailable() is None else "cpu")
    return torch.device(setting)


def of(device: torch.device) -> Platform:
    """The platform of `device`."""
    return platform_class(device.type)(device)


def resolve(setting: str) -> Platform:
    """The platform a `device` setting picks (see `resolve_device`)."""
    return of(resolve_device(setting))
