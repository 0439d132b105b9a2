"""Attention backends: which one computes attention over the paged KV cache (`attention_backend`).

Each backend (an `AttentionBackend`, see `base.py`) owns its KV layout and step metadata.
`registry.py` names them, best first; `auto` takes the first one available on the device. The
backends load when asked for.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from tritonlm.worker.attention.base import AttentionBackend

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


def choose(name: str, device: torch.device) -> type[AttentionBackend]:
    """The backend the setting `attention_backend` = `name` picks on `device`."""
    available = available_backends(device)
    if name == AUTO and available:
        best = available[0]
        from tritonlm import platforms

        ranked = platforms.of(device).attention_backends
        for better in ranked[: ranked.index(best)]:  # why each better one does not run
            why = backend_class(better).unavailable(device)
            log.info("attention_backend auto: %s, not %s (%s)", best, better, why)
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
    return backend_class(name)
