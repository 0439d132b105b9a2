"""Model paths: the code that runs a forward step (`model_path`).

`registry.py` names the paths and the fast path of each (architecture, platform). The generic path
(`transformers`) runs every architecture; `auto` adds the fast path registered for the model's
architecture on this platform when it can run this model (else the log says why), and a named fast
path must run it or start-up fails naming the setting. The runner takes the fast path for every step
it can run (`ModelPath.runs_lora`) and the generic one for the rest.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from tritonlm.worker.model_paths.registry import AUTO, FAST_PATHS, GENERIC, NAMES, PATHS

if TYPE_CHECKING:  # the settings import `registry` through this package: no torch at import time
    from torch import nn

    from tritonlm.platforms.base import Platform
    from tritonlm.worker.attention.base import AttentionBackend
    from tritonlm.worker.model_paths.base import ModelPath

log = logging.getLogger(__name__)


def path_class(name: str) -> type[ModelPath]:
    module, _, cls = PATHS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def architecture(model: nn.Module) -> str:
    names = getattr(model.config, "architectures", None) or [type(model).__name__]
    return names[0]


def fast_path(
    setting: str, model: nn.Module, attention: AttentionBackend, platform: Platform
) -> ModelPath | None:
    """The fast path `model_path` = `setting` gives `model` on `platform` (None: the generic path
    alone). Raises ValueError, naming the setting, for a name that is unknown or cannot run it."""
    if setting not in NAMES:
        raise ValueError(f"model_path: {setting!r} is unknown; allowed: {', '.join(NAMES)}")
    if setting == GENERIC:
        return None
    name = FAST_PATHS.get((architecture(model), platform.name)) if setting == AUTO else setting
    if name is None:
        return None
    built = path_class(name).build(model, attention, platform)
    if not isinstance(built, str):
        return built
    if setting == AUTO:
        log.info("model_path auto: transformers, not %s (%s)", name, built)
        return None
    raise ValueError(f"model_path: {name!r} cannot run this model: {built}; allowed: {AUTO}, {GENERIC}")
