"""Attention backends: which one computes attention over the paged KV cache (`attention_backend`).

Each backend (an `AttentionBackend`, see `base.py`) owns its KV layout and step metadata.
`registry.py` names them, best first; `auto` takes the first one available on the device that
computes every feature the checkpoint needs (`AttentionBackend.computes`; what a checkpoint needs is
`model_support`'s rule), and a backend named that lacks one is refused. The backends load when asked
for.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from tritonlm.worker.attention.base import AttentionBackend

from tritonlm.settings import ConfigError
from tritonlm.worker.attention.registry import AUTO, BACKENDS, NAMES

log = logging.getLogger(__name__)


def backend_class(name: str) -> type[AttentionBackend]:
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def available_backends(device: torch.device) -> list[str]:
    """The backends that run on `device`: its platform's, best first, those that run in this build."""
    from tritonlm import platforms

    names = platforms.of(device).attention_backends
    return [name for name in names if backend_class(name).available(device)]


def lacking(cls: type[AttentionBackend], needs: Mapping[str, str]) -> list[str]:
    """What of `needs` (feature -> what the checkpoint shows of it) the backend does not compute."""
    return [what for feature, what in needs.items() if feature not in cls.computes]


def serves(cls: type[AttentionBackend], needs: Mapping[str, str], kv_cache_dtype: str) -> bool:
    """Whether the backend computes all the checkpoint `needs` over a `kv_cache_dtype` cache."""
    return not lacking(cls, needs) and kv_cache_dtype in cls.kv_cache_dtypes


def _kv_reader(kv_cache_dtype: str, device: torch.device) -> str:
    """Which backend reads a `kv_cache_dtype` cache here, or why none, for an error."""
    from tritonlm import platforms

    for name in platforms.of(device).attention_backends:
        if kv_cache_dtype in backend_class(name).kv_cache_dtypes:
            why = backend_class(name).unavailable(device)
            return (
                f"{name!r} does (attention_backend: {name} or auto)"
                if why is None
                else f"{name!r} does but is {why}"
            )
    return f"no backend on {device.type} does"


def require(
    cls: type[AttentionBackend], needs: Mapping[str, str], device: torch.device, kv_cache_dtype: str = AUTO
) -> None:
    """Refuses a backend that cannot compute every feature the checkpoint `needs`, or cannot read a
    `kv_cache_dtype` cache, naming one that can."""
    if kv_cache_dtype not in cls.kv_cache_dtypes:
        raise ConfigError(
            f"kv_cache_dtype: {kv_cache_dtype!r} is not read by attention_backend {cls.name!r}; "
            f"{_kv_reader(kv_cache_dtype, device)}; or set kv_cache_dtype: auto"
        )
    missing = lacking(cls, needs)
    if not missing:
        return
    available = [backend_class(name) for name in available_backends(device)]
    able = [c for c in available if serves(c, needs, kv_cache_dtype)]
    if not able and kv_cache_dtype != AUTO and any(not lacking(c, needs) for c in available):
        computing = next(c.name for c in available if not lacking(c, needs))
        raise ConfigError(
            f"kv_cache_dtype: {kv_cache_dtype!r} cannot serve this checkpoint exactly: its attention needs "
            f"{'; '.join(missing)}, which no backend reading {kv_cache_dtype} KV caches computes "
            f"({computing!r} does, over kv_cache_dtype: auto)"
        )
    fix = (
        f"{able[0].name!r} does (attention_backend: {able[0].name} or auto)"
        if able
        else "no backend here does"
    )
    raise ConfigError(
        f"attention_backend: {cls.name!r} cannot serve this checkpoint exactly: it does not compute "
        f"{'; '.join(missing)}; {fix}"
    )


def _passed_over(cls: type[AttentionBackend], needs: Mapping[str, str], kv_cache_dtype: str) -> str:
    """Why `auto` does not take an available backend, for the log."""
    if kv_cache_dtype not in cls.kv_cache_dtypes:
        return f"it does not read kv_cache_dtype {kv_cache_dtype}"
    return f"it does not compute {'; '.join(lacking(cls, needs))}"


def choose(
    name: str, device: torch.device, needs: Mapping[str, str] | None = None, kv_cache_dtype: str = AUTO
) -> type[AttentionBackend]:
    """The backend the setting `attention_backend` = `name` picks on `device` for a checkpoint that
    `needs` features beyond causal softmax attention (`model_support.needs`), over a KV cache of
    `kv_cache_dtype`."""
    needs = needs or {}
    available = available_backends(device)
    if name == AUTO and available:
        able = [n for n in available if serves(backend_class(n), needs, kv_cache_dtype)]
        readers = [n for n in available if kv_cache_dtype in backend_class(n).kv_cache_dtypes]
        best = (able or readers or available)[0]  # none able: `require` below says why
        from tritonlm import platforms

        ranked = platforms.of(device).attention_backends
        for better in ranked[: ranked.index(best)]:  # why each better one is not taken
            why = backend_class(better).unavailable(device)
            if why is None:
                why = _passed_over(backend_class(better), needs, kv_cache_dtype)
            log.info("attention_backend auto: %s, not %s (%s)", best, better, why)
        require(backend_class(best), needs, device, kv_cache_dtype)
        return backend_class(best)
    if name not in available:
        if name not in NAMES:
            why = "unknown"
        elif name == AUTO:
            why = f"not available on {device.type}"
        else:
            why = backend_class(name).unavailable(device)
        raise ValueError(
            f"attention_backend: {name!r} is {why}; allowed here: {', '.join([AUTO, *available])}"
        )
    require(backend_class(name), needs, device, kv_cache_dtype)
    return backend_class(name)
