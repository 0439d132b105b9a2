"""Limits on media input, defaults from TGI's POST / and OpenAI chat completions, each overridable
by an environment setting."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

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
    """Each field is read from the environment variable of its upper-cased name prefixed `MEDIA_`
    (e.g. MEDIA_MAX_ITEMS)."""

    max_items: int = 20  # image_url + video_url + audio_url per request (TGI's POST /)
    max_image_bytes: int = 20 * MB  # TGI's POST /
    max_video_bytes: int = 512 * MB
    max_audio_bytes: int = 20 * MB
    # The chat APIs (OpenAI chat completions, and Databricks' chat) allow 40 MB. Unset, they follow
    # MEDIA_MAX_IMAGE_BYTES / MEDIA_MAX_AUDIO_BYTES when those are set, so one setting lowers both.
    max_chat_image_bytes: int = 40 * MB
    max_chat_audio_bytes: int = 40 * MB
    max_image_pixels: int = 4096 * 4096
    max_video_frames: int = 32
    video_frames: int = 0  # frames sampled per video; 0: the checkpoint's default (frames_per_video)
    max_audio_seconds: float = 30.0  # Whisper-style extractors see 30 s windows
    fetch_timeout_s: float = 10.0
    max_redirects: int = 3

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> MediaLimits:
        env = os.environ if env is None else env
        values = {}
        for f in fields(cls):
            raw = env.get(f"MEDIA_{f.name.upper()}")
            if raw is not None:
                cast = type(getattr(cls, f.name))
                try:
                    values[f.name] = cast(raw)
                except ValueError:
                    number = "an integer" if cast is int else "a number"
                    raise ValueError(f"MEDIA_{f.name.upper()} must be {number}, got {raw!r}") from None
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
