"""Which checkpoints take which media, read from config.json alone (no torch), so the frontend, the
preprocessing model and the encoder share one table."""

from __future__ import annotations

import json
from pathlib import Path

# config.json "architectures" entry -> the media kinds that model accepts, in the order we document.
MEDIA_KINDS: dict[str, tuple[str, ...]] = {
    "LlavaForConditionalGeneration": ("image",),
    "LlavaOnevisionForConditionalGeneration": ("image", "video"),
    "Qwen2AudioForConditionalGeneration": ("audio",),
}


def architecture(model_dir: str | Path) -> str | None:
    """The checkpoint's multimodal architecture, or None for a text-only model."""
    config = Path(model_dir) / "config.json"
    names = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    return next((name for name in names if name in MEDIA_KINDS), None)


def media_kinds(model_dir: str | Path) -> tuple[str, ...]:
    """The media a checkpoint accepts; () for a text-only model."""
    name = architecture(model_dir)
    return MEDIA_KINDS[name] if name else ()
