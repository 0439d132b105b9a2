"""Where media bytes come from for the multimodal APIs (`sources`: data URLs, allowed local paths,
http(s) with byte caps). Decoding and the other limits live with the encoder (`tritonlm.multimodal`).
Every failure is a `MediaError` naming the request's content part, never echoing the media's bytes."""

from frontend.media.sources import MediaSources
from tritonlm.multimodal.limits import MediaError, MediaLimits

__all__ = ["MediaError", "MediaLimits", "MediaSources"]
