"""Media sources (data/local/http with every refusal), limits and decoding."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import ipaddress
import threading
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile
from PIL import Image

from frontend.media import MediaError, MediaLimits, MediaSources
from frontend.media.addresses import AddressPolicy
from tritonlm.multimodal.decode import decode_audio, decode_image, frame_positions, sample_video_frames

PART = "messages[0].content[1]"
LOOPBACK = AddressPolicy((ipaddress.ip_network("127.0.0.0/8"),))  # ALLOWED_MEDIA_NETWORKS


def png_bytes(size=(8, 6), color=(200, 10, 10)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def wav_bytes(seconds: float = 0.5, rate: int = 44100) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def mp4_bytes(frames: int = 10) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for i in range(frames):
            image = Image.new("RGB", (32, 32), (i * 25, 0, 0))
            for packet in stream.encode(av.VideoFrame.from_image(image)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def load(sources: MediaSources, url: str, kind: str = "image") -> bytes:
    return asyncio.run(sources.load(url, kind, PART))


def refused(sources: MediaSources, url: str, kind: str = "image") -> MediaError:
    with pytest.raises(MediaError) as info:
        load(sources, url, kind)
    assert info.value.part == PART and str(info.value).startswith(PART)
    return info.value


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """A loopback HTTP server: /img.png, /big (no Content-Length), /loop (redirects forever)."""
    image = png_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/img.png":
                self.send_response(200)
                self.send_header("Content-Length", str(len(image)))
                self.end_headers()
                self.wfile.write(image)
            elif self.path == "/big":
                self.send_response(200)
                self.end_headers()  # no Content-Length: the cap must hold while streaming
                self.wfile.write(b"x" * 5000)
            elif self.path.startswith("/loop"):
                self.send_response(302)
                self.send_header("Location", "/loop")
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", image
    server.shutdown()
    server.server_close()


def test_data_url_and_bad_base64():
    image = png_bytes()
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    assert load(MediaSources(), url) == image
    assert "base64" in str(refused(MediaSources(), "data:image/png;base64,@@@"))
    assert "base64" in str(refused(MediaSources(), "data:image/png,raw"))


def test_data_url_over_byte_limit_is_413():
    sources = MediaSources(MediaLimits(max_image_bytes=100))
    url = "data:image/png;base64," + base64.b64encode(b"x" * 1000).decode()
    assert refused(sources, url).status == 413


def test_local_paths_only_under_the_allowed_directory(tmp_path: Path):
    allowed, outside = tmp_path / "media", tmp_path / "secret"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "a.png").write_bytes(png_bytes())
    (outside / "b.png").write_bytes(b"top secret")
    (allowed / "link.png").symlink_to(outside / "b.png")
    assert "ALLOWED_LOCAL_MEDIA_PATH" in str(refused(MediaSources(), str(allowed / "a.png")))
    sources = MediaSources(allowed_local_paths=[allowed.resolve()])
    assert load(sources, str(allowed / "a.png")) == png_bytes()
    assert load(sources, f"file://{allowed / 'a.png'}") == png_bytes()
    escapes = (allowed / ".." / "secret" / "b.png", allowed / "link.png", outside / "b.png")
    for escape in map(str, escapes):
        error = refused(sources, escape)
        assert "outside" in str(error) and "top secret" not in str(error)
    assert "not a readable file" in str(refused(sources, str(allowed / "missing.png")))
    small = MediaSources(MediaLimits(max_image_bytes=10), allowed_local_paths=[allowed.resolve()])
    assert refused(small, str(allowed / "a.png")).status == 413


def test_unknown_scheme():
    assert "scheme" in str(refused(MediaSources(), "ftp://example.com/a.png"))


def test_http_fetch_and_refusals(web):
    """On loopback, allowed here (test_media_addresses: refused by default)."""
    base, image = web
    sources = MediaSources(addresses=LOOPBACK)
    assert load(sources, f"{base}/img.png") == image
    message = str(refused(sources, f"{base}/missing.png"))
    assert "fetching the image URL failed" in message and "404" not in message  # nothing of the answer
    assert (
        refused(MediaSources(MediaLimits(max_image_bytes=1000), addresses=LOOPBACK), f"{base}/big").status
        == 413
    )
    assert "redirects" in str(refused(sources, f"{base}/loop"))
    only_example = MediaSources(allowed_domains={"example.com"})
    assert "ALLOWED_MEDIA_DOMAINS" in str(refused(only_example, f"{base}/img.png"))


def test_limits_from_env():
    limits = MediaLimits.from_env({"MEDIA_MAX_ITEMS": "3", "MEDIA_MAX_AUDIO_SECONDS": "1.5"})
    assert limits.max_items == 3 and limits.max_audio_seconds == 1.5
    assert MediaLimits().max_image_bytes == 20 * 1024 * 1024


def test_decode_image_and_refusals():
    image = decode_image(png_bytes((8, 6)), MediaLimits(), PART)
    assert image.size == (8, 6) and image.mode == "RGB"
    with pytest.raises(MediaError, match="not a supported image"):
        decode_image(b"GIF89a not really", MediaLimits(), PART)
    with pytest.raises(MediaError, match="pixels"):
        decode_image(png_bytes((8, 6)), MediaLimits(max_image_pixels=40), PART)


def test_video_frames_sampled_evenly():
    assert frame_positions(10, 4) == [0, 3, 6, 9]
    assert frame_positions(3, 8) == [0, 1, 2]
    frames = sample_video_frames(mp4_bytes(10), 4, MediaLimits(), PART)
    assert len(frames) == 4 and frames[0].size == (32, 32)
    reds = [frame.getpixel((16, 16))[0] for frame in frames]
    assert reds == sorted(reds) and reds[-1] > reds[0]  # later frames are redder
    with pytest.raises(MediaError, match="frames requested"):
        sample_video_frames(mp4_bytes(2), 64, MediaLimits(max_video_frames=8), PART)
    with pytest.raises(MediaError, match="not a supported video"):
        sample_video_frames(b"not a video", 4, MediaLimits(), PART)


def test_audio_resampled_and_limited():
    samples = decode_audio(wav_bytes(0.5, 44100), 16000, MediaLimits(), PART)
    assert samples.dtype == np.float32 and abs(samples.size - 8000) < 200
    with pytest.raises(MediaError, match="longer than"):
        decode_audio(wav_bytes(0.5), 16000, MediaLimits(max_audio_seconds=0.1), PART)
    with pytest.raises(MediaError, match="not a supported audio"):
        decode_audio(b"not audio at all", 16000, MediaLimits(), PART)
