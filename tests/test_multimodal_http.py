"""Multimodal requests end to end: a real tritonserver (multimodal_encoder, preprocessing, engine)
and frontend serving the tiny checkpoints. For images and audio the served greedy output equals
transformers `generate` of the same checkpoint with its processor, token for token, whether the media
come as a data URL, a local path under ALLOWED_LOCAL_MEDIA_PATH or an http URL (a loopback server
here); video runs end to end with the documented frame count; media and text requests share batches;
`usage.prompt_tokens` counts the media positions."""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import http.server
import io
import threading
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
import soundfile
import torch
from conftest import running_servers
from PIL import Image
from transformers import AutoProcessor, AutoTokenizer

from tritonlm.multimodal import checkpoints
from tritonlm.multimodal.architectures import architecture
from tritonlm.multimodal.decode import decode_audio
from tritonlm.multimodal.encoder import MODEL_CLASSES
from tritonlm.multimodal.limits import MediaLimits

NEW_TOKENS = 8
VIDEO_FRAMES = 4
TIMEOUT = 120


def png(color: tuple[int, int, int], size=(40, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def wav(seconds: float, hz: float, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def mp4(frames: int = 10) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            image = Image.new("RGB", (64, 48), (20 * i, 255 - 20 * i, 90))
            container.mux(stream.encode(av.VideoFrame.from_image(image)))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class Reference:
    """transformers' own greedy answer: the checkpoint's class and processor, float32."""

    def __init__(self, model_dir: Path) -> None:
        self.model = (
            MODEL_CLASSES[architecture(model_dir)].from_pretrained(model_dir, dtype=torch.float32).eval()
        )
        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)

    @torch.no_grad()
    def generate(self, text: str, **media) -> tuple[list[int], int]:
        """(new token ids, prompt length in positions) for `text` with the processor's media inputs."""
        inputs = self.processor(text=text, return_tensors="pt", **media)
        out = self.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        return out[0, inputs.input_ids.shape[1] :].tolist(), inputs.input_ids.shape[1]

    def chat_text(self, content: list[dict]) -> str:
        return self.processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "red.png").write_bytes(png((220, 20, 20)))
    (root / "blue.png").write_bytes(png((10, 30, 230), size=(50, 60)))
    (root / "tone.wav").write_bytes(wav(0.8, 440))
    return root


@pytest.fixture(scope="module")
def http_media(media_dir) -> str:
    """The media directory over http on loopback."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(media_dir))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mm-checkpoints")


def _serve(root: Path, kind: str, media_dir: Path):
    model_dir = checkpoints.generate(root / kind, kind)
    settings = {
        "ALLOWED_LOCAL_MEDIA_PATH": str(media_dir),
        "MEDIA_VIDEO_FRAMES": str(VIDEO_FRAMES),
        "TRITONLM_MAX_SEQ_LEN": "1024",
    }
    return model_dir, running_servers(model_dir, settings)


@pytest.fixture(scope="module")
def llava(checkpoint_root, media_dir):
    model_dir, servers = _serve(checkpoint_root, "llava", media_dir)
    with servers as started:
        yield started, Reference(model_dir)


@pytest.fixture(scope="module")
def qwen2_audio(checkpoint_root, media_dir):
    model_dir, servers = _serve(checkpoint_root, "qwen2_audio", media_dir)
    with servers as started:
        yield started, Reference(model_dir)


def tgi(servers, inputs, **parameters) -> dict:
    body = {"inputs": inputs, "parameters": {"max_new_tokens": NEW_TOKENS, "details": True, **parameters}}
    response = httpx.post(f"{servers.frontend_url}/", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    out = response.json()
    return out[0] if isinstance(out, list) else out


def chat(servers, content, **fields) -> dict:
    body = {
        "model": servers.model_name,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        **fields,
    }
    response = httpx.post(f"{servers.frontend_url}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("source", ["data", "path", "http"])
def test_image_from_every_source_equals_transformers(llava, media_dir, http_media, source):
    servers, reference = llava
    url = {
        "data": data_url((media_dir / "red.png").read_bytes(), "image/png"),
        "path": str(media_dir / "red.png"),
        "http": f"{http_media}/red.png",
    }[source]
    out = tgi(servers, [{"type": "text", "text": "Describe "}, {"type": "image_url", "image_url": url}])
    image = Image.open(media_dir / "red.png").convert("RGB")
    expected, prompt_len = reference.generate("Describe <image>", images=[image])
    assert [t["id"] for t in out["details"]["tokens"]] == expected
    assert out["details"]["prompt_tokens"] == prompt_len  # the 49 image positions included


def test_chat_image_equals_transformers_and_usage_counts_positions(llava, media_dir):
    servers, reference = llava
    url = data_url((media_dir / "blue.png").read_bytes(), "image/png")
    out = chat(servers, [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}])
    text = reference.chat_text([{"type": "image"}, {"type": "text", "text": "What?"}])
    image = Image.open(media_dir / "blue.png").convert("RGB")
    expected, prompt_len = reference.generate(text, images=[image])
    assert out["choices"][0]["message"]["content"] == reference.tokenizer.decode(
        expected, skip_special_tokens=True
    )
    assert out["usage"]["prompt_tokens"] == prompt_len


def test_same_image_reuses_cached_blocks_and_another_does_not(llava, media_dir):
    servers, _ = llava
    parts = lambda name: [  # noqa: E731
        {"type": "image_url", "image_url": data_url((media_dir / name).read_bytes(), "image/png")},
        {"type": "text", "text": "Again and again and again and again"},
    ]
    first = chat(servers, parts("red.png"))
    again = chat(servers, parts("red.png"))
    other = chat(servers, parts("blue.png"))
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    # Same ids (the placeholders) but different pixels: only the template's first block may be shared.
    assert (
        other["usage"]["prompt_tokens_details"]["cached_tokens"]
        < again["usage"]["prompt_tokens_details"]["cached_tokens"]
    )


def test_media_and_text_requests_share_batches(llava, media_dir):
    servers, reference = llava
    red = data_url((media_dir / "red.png").read_bytes(), "image/png")
    blue = data_url((media_dir / "blue.png").read_bytes(), "image/png")
    requests = [
        [{"type": "text", "text": "Describe "}, {"type": "image_url", "image_url": red}],
        "Describe a plain text prompt",
        [{"type": "text", "text": "Describe "}, {"type": "image_url", "image_url": blue}],
    ] * 2
    alone = [tgi(servers, inputs)["generated_text"] for inputs in requests[:3]]
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda inputs: tgi(servers, inputs)["generated_text"], requests))
    assert together == alone * 2
    assert alone[0] != alone[2]


def test_audio_equals_transformers(qwen2_audio, media_dir, http_media):
    servers, reference = qwen2_audio
    data = (media_dir / "tone.wav").read_bytes()
    rate = reference.processor.feature_extractor.sampling_rate
    samples = decode_audio(data, rate, MediaLimits(), "audio")
    text = reference.chat_text([{"type": "audio", "audio": "<audio>"}, {"type": "text", "text": "Listen"}])
    expected, prompt_len = reference.generate(text, audio=[samples], sampling_rate=rate)
    for part in (
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": f"{http_media}/tone.wav"}},
    ):
        out = chat(servers, [part, {"type": "text", "text": "Listen"}])
        assert out["choices"][0]["message"]["content"] == reference.tokenizer.decode(
            expected, skip_special_tokens=True
        )
        assert out["usage"]["prompt_tokens"] == prompt_len


def test_video_end_to_end(checkpoint_root, media_dir):
    """LLaVA-OneVision: a video is sampled to MEDIA_VIDEO_FRAMES frames (positions: tested in
    test_onevision.py), each 9 rows after pooling plus one newline row: the prompt counts them."""
    model_dir, servers = _serve(checkpoint_root, "llava_onevision", media_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with servers as started:
        url = data_url(mp4(), "video/mp4")
        out = chat(
            started, [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "Summary"}]
        )
    assert 0 < out["usage"]["completion_tokens"] <= NEW_TOKENS
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Summary"}]}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # The <video> token becomes 9 pooled rows per sampled frame plus one newline row.
    assert out["usage"]["prompt_tokens"] == len(tokenizer(prompt).input_ids) - 1 + VIDEO_FRAMES * 9 + 1
