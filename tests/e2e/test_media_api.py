"""Media content parts against real frontends (`python -m frontend`, started by the launcher's own
`start_frontend`): one serving a tiny Llava checkpoint (images only), one the text-only default
model. Every refusal happens before Triton is asked anything, so these frontends point at a port
where no Triton listens. Requests that pass validation run on a real tritonserver (the last test)."""

from __future__ import annotations

import base64
import http.server
import io
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import httpx
import pytest
from conftest import free_port
from PIL import Image

import launcher

SECRET = b"TOPSECRET-file-content"
# Small enough that a test's data URL goes over it; the chat APIs follow MEDIA_MAX_IMAGE_BYTES.
MAX_IMAGE_BYTES = 4096


def png_bytes(color=(0, 90, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 40), color).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@dataclass
class Media:
    allowed: Path  # ALLOWED_LOCAL_MEDIA_PATH
    image: Path  # a PNG inside it
    secret: Path  # a file outside it
    link: Path  # a symlink inside it to the secret
    web: str  # a loopback http server: /image.png, anything else 404


class _Web(http.server.BaseHTTPRequestHandler):
    image = b""

    def do_GET(self):
        if self.path != "/image.png":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.image)))
        self.end_headers()
        self.wfile.write(self.image)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Iterator[Media]:
    root = tmp_path_factory.mktemp("media")
    allowed, outside = root / "allowed", root / "outside"
    allowed.mkdir()
    outside.mkdir()
    image, secret, link = allowed / "image.png", outside / "secret.png", allowed / "link.png"
    image.write_bytes(png_bytes())
    secret.write_bytes(SECRET)
    link.symlink_to(secret)
    _Web.image = image.read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Web)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Media(allowed, image, secret, link, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def llava_dir(multimodal_checkpoints) -> Path:
    return multimodal_checkpoints("llava")


def media_env(media: Media) -> dict[str, str]:
    return {
        "ALLOWED_LOCAL_MEDIA_PATH": str(media.allowed),
        "MEDIA_MAX_IMAGE_BYTES": str(MAX_IMAGE_BYTES),
        "ALLOWED_MEDIA_NETWORKS": "127.0.0.0/8",  # the test's media server (refused by default)
    }


@pytest.fixture(scope="module")
def frontends(llava_dir: Path, model_dir: Path, media: Media, tmp_path_factory) -> Iterator[dict[str, str]]:
    """{"llava": url, "text": url}: frontends of each model, without a Triton behind them."""
    log_dir = tmp_path_factory.mktemp("frontends")
    nobody = f"127.0.0.1:{free_port()}"  # no Triton: nothing here may reach one
    urls, processes = {}, []
    try:
        with mock.patch.dict(os.environ, media_env(media)):
            for name, directory in (("llava", llava_dir), ("text", model_dir)):
                ports = launcher.Ports(frontend=free_port())
                log = log_dir / f"{name}.log"
                process = launcher.start_frontend(
                    ports, "default", log, model_dir=directory, triton_urls=nobody
                )
                processes.append(process)
                urls[name] = f"http://127.0.0.1:{ports.frontend}"
        for name, process in zip(urls, processes, strict=True):
            launcher.wait_ready(f"{urls[name]}/v1/models", process, 60, f"{name} frontend")
        yield urls
    finally:
        for process in processes:
            launcher.stop(process)


# ---------------------------------------------------------------------------------------------
# Each API's request with one media part (index 1, after a text part), and its error's field.


def chat_body(part: dict, model: str | None = "default") -> dict:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]}
    return {"model": model, **body} if model else body


API_PATHS = {
    "openai": ("/v1/chat/completions", lambda part: chat_body(part)),
    "databricks": ("/serving-endpoints/default/invocations", lambda part: chat_body(part, None)),
    "tgi": ("/", lambda part: {"inputs": [{"type": "text", "text": "What is this?"}, part]}),
}


def refusal(url: str, api: str, part: dict, status: int = 400) -> tuple[str, str | None]:
    """POST a request with `part` to `api`; check the error's format; its message and param."""
    path, body = API_PATHS[api]
    r = httpx.post(url + path, json=body(part), timeout=30)
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text and SECRET.decode() not in r.text
    if api == "tgi":
        payload = r.json()
        assert set(payload) == {"error", "error_type"}
        assert payload["error_type"] == ("validation" if status == 400 else "payload_too_large")
        return payload["error"], None
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error["message"], error["param"]


def part_name(api: str) -> str:
    return "inputs[1]" if api == "tgi" else "messages[0].content[1]"


def check_names_part(api: str, message: str, param: str | None) -> None:
    assert message.startswith(part_name(api) + ": "), message
    assert param in (None, part_name(api))


APIS = list(API_PATHS)


@pytest.mark.parametrize("api", APIS)
def test_text_only_model_refuses_media(frontends, media, api):
    part = {"type": "image_url", "image_url": data_url(png_bytes())}
    message, param = refusal(frontends["text"], api, part)
    check_names_part(api, message, param)
    assert "this model is text-only" in message


@pytest.mark.parametrize("api", APIS)
def test_local_paths_outside_the_allow_list(frontends, media, api):
    escapes = [
        str(media.secret),  # plainly outside
        f"{media.allowed}/../outside/secret.png",  # ../ out of the directory
        str(media.link),  # a symlink inside that points outside
        f"file://{media.allowed}/../outside/secret.png",
    ]
    for path in escapes:
        message, param = refusal(frontends["llava"], api, {"type": "image_url", "image_url": path})
        check_names_part(api, message, param)
        assert "outside ALLOWED_LOCAL_MEDIA_PATH" in message and str(media.allowed) not in message
    message, _ = refusal(
        frontends["llava"], api, {"type": "image_url", "image_url": f"{media.allowed}/none.png"}
    )
    assert "not a readable file" in message


@pytest.mark.parametrize("api", APIS)
def test_source_refusals(frontends, media, api):
    url = frontends["llava"]
    cases = [
        ({"url": "ftp://example.com/a.png"}, "unsupported URL scheme 'ftp'"),
        ({"url": f"{media.web}/missing.png"}, "fetching the image URL failed (no 200 answer"),
        ({"url": "data:image/png;base64,not*base64"}, "not valid base64"),
        ({"url": "data:image/png,raw"}, "must be base64-encoded"),
        ({"url": ""}, "non-empty string"),
    ]
    for image_url, words in cases:
        message, param = refusal(url, api, {"type": "image_url", "image_url": image_url})
        check_names_part(api, message, param)
        assert words in message, message


@pytest.mark.parametrize("api", APIS)
def test_oversized_data_url_is_413(frontends, api):
    part = {"type": "image_url", "image_url": {"url": data_url(b"x" * (MAX_IMAGE_BYTES + 1))}}
    message, param = refusal(frontends["llava"], api, part, status=413)
    check_names_part(api, message, param)
    assert f"larger than {MAX_IMAGE_BYTES} bytes" in message


@pytest.mark.parametrize("api", APIS)
def test_more_than_20_items(frontends, api):
    path, body = API_PATHS[api]
    request = body({"type": "image_url", "image_url": data_url(png_bytes())})
    parts = request["inputs"] if api == "tgi" else request["messages"][0]["content"]
    parts += [parts[1]] * 20  # 21 images
    r = httpx.post(frontends["llava"] + path, json=request, timeout=30)
    assert r.status_code == 400, r.text
    field = "inputs" if api == "tgi" else "messages"
    if api == "tgi":
        assert r.json()["error"].startswith(f"{field}: at most 20 ")
    else:
        assert r.json()["error"]["param"] == field and "at most 20 " in r.json()["error"]["message"]


@pytest.mark.parametrize("api", APIS)
def test_a_kind_the_model_does_not_take(frontends, api):
    wrong = [
        {"type": "video_url", "video_url": "/v.mp4"},
        {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
    ]
    if api != "tgi":
        wrong.append({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}})
    for part in wrong:
        message, param = refusal(frontends["llava"], api, part)
        check_names_part(api, message, param)
        assert "only image (image_url)" in message, message


@pytest.mark.parametrize("api", APIS)
def test_malformed_parts_name_the_field(frontends, api):
    path, body = API_PATHS[api]
    r = httpx.post(frontends["llava"] + path, json=body({"type": "image_url", "image_url": 5}), timeout=30)
    assert r.status_code == (422 if api == "tgi" else 400), r.text
    assert f"{part_name(api)}.image_url: must be a URL string" in r.text


# ---------------------------------------------------------------------------------------------
# Requests that pass: a real tritonserver serving the Llava checkpoint. Fidelity per source, audio,
# video, batching and usage: tests/e2e/test_multimodal_http.py; here, every API's route and shape.


@pytest.mark.parametrize("api", APIS)
def test_every_api_generates_with_an_image(multimodal_servers, api):
    llava_servers = multimodal_servers("llava")  # conftest's: shared with the other multimodal tests
    path, body = API_PATHS[api]
    request = body({"type": "image_url", "image_url": data_url(png_bytes())})
    if api == "openai":
        request["model"] = llava_servers.model_name  # served by its directory's name
    path = path.replace("/default/", f"/{llava_servers.model_name}/")
    if api == "tgi":
        request["parameters"] = {"max_new_tokens": 4, "details": True, "decoder_input_details": True}
    else:
        request["max_tokens"] = 4
    r = httpx.post(llava_servers.frontend_url + path, json=request, timeout=120)
    assert r.status_code == 200, r.text
    if api == "tgi":
        details = r.json()[0]["details"]
        assert details["prompt_tokens"] >= 49  # the image's positions
        assert details["prefill"], "decoder_input_details lists the prompt's tokens"
    else:
        assert r.json()["usage"]["prompt_tokens"] >= 49
