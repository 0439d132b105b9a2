"""Multimodal requests through the HTTP APIs, end to end (conftest's multimodal_servers: tritonserver
with multimodal_encoder, preprocessing and the engine, plus the frontend). For images and audio the
served greedy output equals transformers `generate` with the checkpoint's processor, token for token,
whether the media come as a data URL, a local path under ALLOWED_LOCAL_MEDIA_PATH or an http URL (a
loopback server here); video runs end to end with the configured frame count; media and text
requests share batches; the prefix cache reuses a re-sent image's blocks; `usage.prompt_tokens`
counts the media positions."""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import http.server
import threading
from pathlib import Path

import httpx
import pytest
from conftest import MULTIMODAL_VIDEO_FRAMES
from transformers import AutoTokenizer

from tests.multimodal_helpers import Reference, data_url, mp4, png, wav

NEW_TOKENS = 8
TIMEOUT = 120


@pytest.fixture(scope="module")
def media_dir(multimodal_media) -> Path:
    """Files under the servers' ALLOWED_LOCAL_MEDIA_PATH."""
    (multimodal_media / "first.png").write_bytes(png(11))
    (multimodal_media / "second.png").write_bytes(png(12, (50, 60)))
    (multimodal_media / "tone.wav").write_bytes(wav(0.8, 440))
    return multimodal_media


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
def llava(multimodal_servers, multimodal_checkpoints):
    return multimodal_servers("llava"), Reference(multimodal_checkpoints("llava"), NEW_TOKENS)


@pytest.fixture(scope="module")
def qwen2_audio(multimodal_servers, multimodal_checkpoints):
    return multimodal_servers("qwen2_audio"), Reference(multimodal_checkpoints("qwen2_audio"), NEW_TOKENS)


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
        "ignore_eos": True,
        **fields,
    }
    response = httpx.post(f"{servers.frontend_url}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("source", ["data", "path", "http"])
def test_image_from_every_source_equals_transformers(llava, media_dir, http_media, source):
    servers, reference = llava
    data = (media_dir / "first.png").read_bytes()
    url = {
        "data": data_url(data, "image/png"),
        "path": str(media_dir / "first.png"),
        "http": f"{http_media}/first.png",
    }[source]
    out = tgi(servers, [{"type": "text", "text": "Describe "}, {"type": "image_url", "image_url": url}])
    assert [t["id"] for t in out["details"]["tokens"]] == reference.generate(
        "Describe <image>", [data], "image"
    )


def test_chat_image_equals_transformers_and_usage_counts_positions(llava, media_dir):
    servers, reference = llava
    data = (media_dir / "second.png").read_bytes()
    url = data_url(data, "image/png")
    out = chat(servers, [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}])
    text = reference.chat([{"type": "image"}, {"type": "text", "text": "What?"}])
    assert out["choices"][0]["message"]["content"] == reference.decode(
        reference.generate(text, [data], "image")
    )
    assert out["usage"]["prompt_tokens"] == reference.inputs(text, [data], "image").input_ids.shape[1]


def test_same_image_reuses_cached_blocks_and_another_does_not(llava, media_dir):
    servers, _ = llava

    def parts(name: str) -> list[dict]:
        image = data_url((media_dir / name).read_bytes(), "image/png")
        return [
            {"type": "image_url", "image_url": image},
            {"type": "text", "text": "Again and again and again and again"},
        ]

    first = chat(servers, parts("first.png"))
    again = chat(servers, parts("first.png"))
    other = chat(servers, parts("second.png"))
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    # The same placeholder ids, other pixels: at most the template's blocks before the image are shared.
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] < cached


def test_media_and_text_requests_share_batches(llava, media_dir):
    servers, _ = llava
    first = data_url((media_dir / "first.png").read_bytes(), "image/png")
    second = data_url((media_dir / "second.png").read_bytes(), "image/png")
    requests = [
        [{"type": "text", "text": "Describe "}, {"type": "image_url", "image_url": first}],
        "Describe a plain text prompt",
        [{"type": "text", "text": "Describe "}, {"type": "image_url", "image_url": second}],
    ]
    alone = [tgi(servers, inputs)["generated_text"] for inputs in requests]
    with concurrent.futures.ThreadPoolExecutor(2 * len(requests)) as pool:
        together = list(pool.map(lambda inputs: tgi(servers, inputs)["generated_text"], requests * 2))
    assert together == alone * 2
    assert alone[0] != alone[2]


def test_audio_equals_transformers(qwen2_audio, media_dir, http_media):
    servers, reference = qwen2_audio
    data = (media_dir / "tone.wav").read_bytes()
    text = reference.chat([{"type": "audio", "audio": "<audio>"}, {"type": "text", "text": "Listen"}])
    expected = reference.decode(reference.generate(text, [data], "audio"))
    prompt_len = reference.inputs(text, [data], "audio").input_ids.shape[1]
    for part in (
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": f"{http_media}/tone.wav"}},
    ):
        out = chat(servers, [part, {"type": "text", "text": "Listen"}])
        assert out["choices"][0]["message"]["content"] == expected
        assert out["usage"]["prompt_tokens"] == prompt_len


def test_video_end_to_end(multimodal_servers, multimodal_checkpoints):
    """LLaVA-OneVision: a video is sampled to MEDIA_VIDEO_FRAMES frames (which ones: test_onevision.py),
    each 9 rows after pooling, plus one newline row: the prompt counts them."""
    servers = multimodal_servers("llava_onevision")
    tokenizer = AutoTokenizer.from_pretrained(multimodal_checkpoints("llava_onevision"))
    url = data_url(mp4(), "video/mp4")
    out = chat(
        servers, [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "Summary"}]
    )
    assert out["usage"]["completion_tokens"] == NEW_TOKENS
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Summary"}]}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # The <video> token becomes 9 pooled rows per sampled frame plus one newline row.
    video_rows = MULTIMODAL_VIDEO_FRAMES * 9 + 1
    assert out["usage"]["prompt_tokens"] == len(tokenizer(prompt).input_ids) - 1 + video_rows


@pytest.mark.parametrize("api", ["openai", "tgi"])
def test_bytes_that_are_not_an_image_are_refused_naming_the_part(llava, api):
    servers, _ = llava
    url = data_url(b"GIF89a definitely not a png", "image/png")
    if api == "openai":
        body = {
            "model": servers.model_name,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": url}],
                }
            ],
        }
        response = httpx.post(f"{servers.frontend_url}/v1/chat/completions", json=body, timeout=TIMEOUT)
        error = response.json()["error"]
        assert error["param"] == "messages[0].content[1]" and "not a supported image" in error["message"]
    else:
        body = {"inputs": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": url}]}
        response = httpx.post(f"{servers.frontend_url}/", json=body, timeout=TIMEOUT)
        error = response.json()
        assert error["error"].startswith("inputs[1]: the bytes are not a supported image"), error
    assert response.status_code == 400, response.text
    assert "definitely" not in response.text  # never the file's content
