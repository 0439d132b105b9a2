"""Media input (images, video, audio) for the multimodal APIs: where bytes come from (`sources`),
what they may weigh (`limits`) and how they are decoded (`decode`). Every failure is a `MediaError`
naming the request's content part, never echoing the media's bytes."""

from frontend.media.decode import decode_audio, decode_image, sample_video_frames
from frontend.media.limits import MediaError, MediaLimits
from frontend.media.sources import MediaSources

__all__ = [
    "MediaError",
    "MediaLimits",
    "MediaSources",
    "decode_audio",
    "decode_image",
    "sample_video_frames",
]
