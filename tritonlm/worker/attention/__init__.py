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


def require(cls: type[AttentionBackend], needs: Mapping[str, str], device: torch.device) -> None:
    """Refuses a backend that cannot compute every feature the checkpoint `needs`, naming one that can."""
    missing = lacking(cls, needs)
    if not missing:
        return
    able = [name for name in available_backends(device) if not lacking(backend_class(name), needs)]
    fix = f"{able[0]!r} does (attention_backend: {able[0]} or auto)" if able else "no backend here does"
    raise ConfigError(
        f"attention_backend: {cls.name!r} cannot serve this checkpoint exactly: it does not compute "
        f"{'; '.join(missing)}; {fix}"
    )


def choose(name: str, device: torch.device, needs: Mapping[str, str] | None = None) -> type[AttentionBackend]:
    """The backend the setting `attention_backend` = `name` picks on `device` for a checkpoint that
    `needs` features beyond causal softmax attention (`model_support.needs`)."""
    needs = needs or {}
    available = available_backends(device)
    if name == AUTO and available:
        able = [n for n in available if not lacking(backend_class(n), needs)]
        best = able[0] if able else available[0]  # none able: `require` below says so
        from tritonlm import platforms

        ranked = platforms.of(device).attention_backends
        for better in ranked[: ranked.index(best)]:  # why each better one is not taken
            why = backend_class(better).unavailable(device)
            if why is None:
                why = f"it does not compute {'; '.join(lacking(backend_class(better), needs))}"
            log.info("attention_backend auto: %s, not %s (%s)", best, better, why)
        require(backend_class(best), needs, device)
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
    require(backend_class(name), needs, device)
    return backend_class(name)
