"""Limits on media input, defaults from TGI's POST / and OpenAI chat completions, each overridable
by an environment setting."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tritonlm import settings
from tritonlm.settings import setting

MB = 1024 * 1024
# Frames sampled per video when neither MEDIA_VIDEO_FRAMES nor the checkpoint says (vLLM's default).
DEFAULT_VIDEO_FRAMES = 32
KINDS = ("image", "video", "audio")


class MediaError(ValueError):
    """A media item the server refuses. `part`: the request field at fault
    (e.g. `messages[0].content[1]`); `status`: 400, or 413 for a payload over a byte limit."""

    def __init__(self, part: str, message: str, status: int = 400) -> None:
        super().__init__(f"{part}: {message}")
        self.part = part
        self.status = status


@dataclass(frozen=True)
class MediaLimits:
    """Each field is a setting: the environment variable MEDIA_<NAME> (e.g. MEDIA_MAX_ITEMS) and, in
    the frontend and the launcher, the flag --media-<name>."""

    ENV_PREFIX: ClassVar[str] = "MEDIA_"

    max_items: int = setting(  # TGI's POST /
        20, "media items (image, video, audio) per request", flag="--media-max-items"
    )
    max_image_bytes: int = setting(20 * MB, "bytes per image (TGI's POST /)", flag="--media-max-image-bytes")
    max_video_bytes: int = setting(512 * MB, "bytes per video", flag="--media-max-video-bytes")
    max_audio_bytes: int = setting(
        20 * MB, "bytes per audio clip (TGI's POST /)", flag="--media-max-audio-bytes"
    )
    # The chat APIs (OpenAI chat completions, and Databricks' chat) allow 40 MB.
    max_chat_image_bytes: int = setting(
        40 * MB,
        "bytes per image on the chat APIs (OpenAI, Databricks); unset, it follows "
        "MEDIA_MAX_IMAGE_BYTES when that is set",
        flag="--media-max-chat-image-bytes",
    )
    max_chat_audio_bytes: int = setting(
        40 * MB,
        "bytes per audio clip on the chat APIs; unset, it follows MEDIA_MAX_AUDIO_BYTES when that is set",
        flag="--media-max-chat-audio-bytes",
    )
    max_image_pixels: int = setting(4096 * 4096, "pixels per decoded image", flag="--media-max-image-pixels")
    max_video_frames: int = setting(32, "frames sampled per video, at most", flag="--media-max-video-frames")
    video_frames: int = setting(
        0,
        f"frames sampled per video; 0: the checkpoint's video processor's count, else {DEFAULT_VIDEO_FRAMES}",
        flag="--media-video-frames",
    )
    max_audio_seconds: float = setting(  # Whisper-style extractors see 30 s windows
        30.0, "seconds per audio clip", flag="--media-max-audio-seconds"
    )
    fetch_timeout_s: float = setting(
        10.0, "seconds to fetch one http(s) media URL, redirects included", flag="--media-fetch-timeout-s"
    )
    max_redirects: int = setting(3, "redirects followed per media URL", flag="--media-max-redirects")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MediaLimits:
        """From MEDIA_* variables of `env` (default: this process's environment)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for d in settings.declared(cls):
            raw = env.get(d.env)
            if raw is not None:
                cast = type(d.default)
                try:
                    values[d.name] = cast(raw)
                except ValueError:
                    number = "an integer" if cast is int else "a number"
                    raise ValueError(f"{d.env} must be {number}, got {raw!r}") from None
        return cls.from_values(values)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> MediaLimits:
        """From the limits that are set: an unset chat byte limit follows the general one when that is
        set, so one setting lowers both."""
        values = dict(values)
        for kind in ("image", "audio"):
            if f"max_{kind}_bytes" in values:
                values.setdefault(f"max_chat_{kind}_bytes", values[f"max_{kind}_bytes"])
        return cls(**values)

    def frames_per_video(self, checkpoint_frames: int | None = None) -> int:
        """Frames to sample from each video: MEDIA_VIDEO_FRAMES if set, else the checkpoint's video
        processor's own count (`checkpoint_frames`, when it samples), else DEFAULT_VIDEO_FRAMES;
        never more than max_video_frames. `decode.frame_positions` says which."""
        frames = self.video_frames or checkpoint_frames or DEFAULT_VIDEO_FRAMES
        return max(1, min(frames, self.max_video_frames))

    def max_bytes(self, kind: str, chat: bool = False) -> int:
        """Bytes allowed per item of `kind`; `chat`: on the chat APIs (OpenAI's larger limits)."""
        if chat and hasattr(self, f"max_chat_{kind}_bytes"):
            return getattr(self, f"max_chat_{kind}_bytes")
        return getattr(self, f"max_{kind}_bytes")
