"""Which checkpoints take which media, read from config.json alone (no torch), so the frontend, the
preprocessing model and the encoder share one table."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# config.json "architectures" entry -> the media kinds that model accepts, in the order we document.
MEDIA_KINDS: dict[str, tuple[str, ...]] = {
    "LlavaForConditionalGeneration": ("image",),
    "LlavaOnevisionForConditionalGeneration": ("image", "video"),
    "Qwen2AudioForConditionalGeneration": ("audio",),
}
# Each kind's placeholder token where the processor's settings name none (transformers' defaults).
DEFAULT_TOKENS = {"image": "<image>", "video": "<video>", "audio": "<|AUDIO|>"}


def architecture(model_dir: str | Path) -> str | None:
    """The checkpoint's multimodal architecture, or None for a text-only model."""
    config = Path(model_dir) / "config.json"
    names = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    return next((name for name in names if name in MEDIA_KINDS), None)


def media_kinds(model_dir: str | Path) -> tuple[str, ...]:
    """The media a checkpoint accepts; () for a text-only model."""
    name = architecture(model_dir)
    return MEDIA_KINDS[name] if name else ()


@dataclass(frozen=True)
class Placeholder:
    """How a media item sits in a prompt: `text`, what a media part renders to (the processor's and
    chat template's own text), around `token`, the one token whose position becomes the item's rows."""

    text: str
    token: str


def placeholders(model_dir: str | Path) -> dict[str, Placeholder]:
    """Per media kind the checkpoint takes, its placeholder, from the processor's saved settings
    (processor_config.json; the architecture's defaults where it says nothing)."""
    path = Path(model_dir) / "processor_config.json"
    saved = json.loads(path.read_text()) if path.is_file() else {}
    found = {}
    for kind in media_kinds(model_dir):
        token = saved.get(f"{kind}_token") or DEFAULT_TOKENS[kind]
        # Qwen2Audio (the one audio architecture) wraps its audio token in begin/end markers.
        if kind == "audio":
            text = (
                saved.get("audio_bos_token", "<|audio_bos|>")
                + token
                + saved.get("audio_eos_token", "<|audio_eos|>")
            )
        else:
            text = token
        found[kind] = Placeholder(text, token)
    return found
