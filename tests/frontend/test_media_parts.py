"""Media content parts without Triton: parsing into placeholders and MediaRefs, the checks against
the served model and the limits, concurrent fetching, and what each route puts on its Job (a fake
Triton answers; a spy on `Job.values` keeps the Job the route built)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import ipaddress
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from test_frontend_unit import FakeTriton

from frontend.app import create_app
from frontend.config import FrontendConfig
from frontend.engine_client.request import MediaItem
from frontend.media import MediaError, MediaLimits, MediaSources
from frontend.media.addresses import AddressPolicy
from frontend.media.attach import check, fetch_all
from frontend.media.parts import MediaRef, chat_media, text_of, tgi_media

PNG = b"\x89PNG\r\n\x1a\n not decoded by the frontend"
WAV = b"RIFF....WAVEfmt "
LOOPBACK = AddressPolicy((ipaddress.ip_network("127.0.0.0/8"),))  # ALLOWED_MEDIA_NETWORKS: the test servers


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# ---------------------------------------------------------------------------------------------
# Parsing


def test_chat_parts_become_placeholders_and_refs_in_prompt_order():
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                {"type": "text", "text": "and"},
                {"type": "video_url", "video_url": "/media/b.mp4"},  # the API's shorthand
                {"type": "audio_url", "audio_url": {"url": "file:///media/c.wav"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "mp3"}},
            ],
        },
    ]
    out, refs = chat_media(messages)
    assert out[0] == messages[0]
    assert out[1]["content"] == [
        {"type": "image", "image": "<image>"},
        {"type": "text", "text": "and"},
        {"type": "video", "video": "<video>"},
        {"type": "audio", "audio": "<audio>"},
        {"type": "audio", "audio": "<audio>"},
    ]
    assert refs == [
        MediaRef("image", "https://x.test/a.png", "messages[1].content[0]", "image_url"),
        MediaRef("video", "/media/b.mp4", "messages[1].content[2]", "video_url"),
        MediaRef("audio", "file:///media/c.wav", "messages[1].content[3]", "audio_url"),
        MediaRef("audio", "data:audio/mpeg;base64,UklGRg==", "messages[1].content[4]", "input_audio"),
    ]
    assert messages[1]["content"][0]["type"] == "image_url"  # the request itself is left as it was


def test_tgi_inputs_become_prompt_parts():
    inputs = [
        {"type": "text", "text": "My name is Olivier and I"},
        {"type": "image_url", "image_url": {"url": "/xxxx/test.png"}},
        {"type": "text", "text": " like"},
        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,AA=="}},
    ]
    parts, refs = tgi_media(inputs)
    assert parts == [
        {"type": "text", "text": "My name is Olivier and I"},
        {"type": "image"},
        {"type": "text", "text": " like"},
        {"type": "audio"},
    ]
    assert [(r.kind, r.part) for r in refs] == [("image", "inputs[1]"), ("audio", "inputs[3]")]
    assert text_of(inputs) == "My name is Olivier and I like"


# ---------------------------------------------------------------------------------------------
# Checks and limits


def refs_of(*kinds: str) -> list[MediaRef]:
    types = {"image": "image_url", "video": "video_url", "audio": "audio_url"}
    return [MediaRef(k, "x", f"messages[0].content[{i}]", types[k]) for i, k in enumerate(kinds)]


def test_check_text_only_count_and_kinds():
    with pytest.raises(
        MediaError, match=r"messages\[0\].content\[0\]: type 'image_url': this model is text-only"
    ):
        check(refs_of("image"), (), 20, "messages")
    with pytest.raises(MediaError, match="at most 20 .* got 21") as info:
        check(refs_of(*["image"] * 21), ("image",), 20, "messages")
    assert info.value.part == "messages" and info.value.status == 400
    with pytest.raises(
        MediaError, match=r"content\[1\]: type 'video_url': this model takes no video, only image"
    ) as info:
        check(refs_of("image", "video"), ("image",), 20, "messages")
    assert info.value.part == "messages[0].content[1]"
    check(refs_of(*["image"] * 20), ("image", "video"), 20, "messages")


def test_chat_byte_limits_follow_openai_chat_and_the_settings():
    mb = 1024 * 1024
    limits = MediaLimits()
    assert (limits.max_bytes("image"), limits.max_bytes("image", chat=True)) == (20 * mb, 40 * mb)
    assert (limits.max_bytes("audio"), limits.max_bytes("audio", chat=True)) == (20 * mb, 40 * mb)
    assert limits.max_bytes("video") == limits.max_bytes("video", chat=True) == 512 * mb
    lowered = MediaLimits.from_env({"MEDIA_MAX_IMAGE_BYTES": "1000"})  # one setting lowers both
    assert lowered.max_bytes("image") == lowered.max_bytes("image", chat=True) == 1000
    apart = MediaLimits.from_env({"MEDIA_MAX_IMAGE_BYTES": "1000", "MEDIA_MAX_CHAT_IMAGE_BYTES": "3000"})
    assert (apart.max_bytes("image"), apart.max_bytes("image", chat=True)) == (1000, 3000)
    with pytest.raises(ValueError, match="MEDIA_MAX_ITEMS must be an integer, got 'lots'"):
        MediaLimits.from_env({"MEDIA_MAX_ITEMS": "lots"})  # python -m frontend reports it and exits


def test_data_url_limit_is_per_api():
    sources = MediaSources(MediaLimits(max_image_bytes=30, max_chat_image_bytes=60))
    payload = data_url(b"x" * 45)
    with pytest.raises(MediaError) as info:
        asyncio.run(sources.load(payload, "image", "inputs[0]"))
    assert info.value.status == 413
    assert asyncio.run(sources.load(payload, "image", "messages[0].content[0]", chat=True)) == b"x" * 45


# ---------------------------------------------------------------------------------------------
# Concurrent fetching


class _Pair(http.server.BaseHTTPRequestHandler):
    """Answers only when two requests are in flight at once: sequential fetching would time out."""

    barrier: threading.Barrier

    def do_GET(self):
        try:
            self.barrier.wait(timeout=10)
        except threading.BrokenBarrierError:
            self.send_error(503)
            return
        if self.path == "/missing.png":
            self.send_error(404)
            return
        body = self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def pair_server() -> Iterator[str]:
    _Pair.barrier = threading.Barrier(2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pair)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_items_are_fetched_concurrently_in_prompt_order(pair_server):
    refs = [MediaRef("image", f"{pair_server}/{n}.png", f"inputs[{n}]", "image_url") for n in (0, 1)]
    items = asyncio.run(fetch_all(MediaSources(addresses=LOOPBACK), refs, chat=False))
    assert items == (MediaItem("image", b"/0.png", "inputs[0]"), MediaItem("image", b"/1.png", "inputs[1]"))


def test_the_first_refusal_in_prompt_order_is_raised(pair_server):
    refs = [
        MediaRef("image", f"{pair_server}/missing.png", "inputs[0]", "image_url"),
        MediaRef("image", f"{pair_server}/fine.png", "inputs[1]", "image_url"),
        MediaRef("image", "ftp://x/y.png", "inputs[2]", "image_url"),
    ]
    with pytest.raises(MediaError) as info:
        asyncio.run(fetch_all(MediaSources(addresses=LOOPBACK), refs, chat=False))
    assert info.value.part in ("inputs[0]", "inputs[2]")  # whichever failed; never a wrapped group
    refs = [MediaRef("image", "data:image/png;base64,!!", "inputs[0]", "image_url"), refs[2]]
    with pytest.raises(MediaError, match=r"^inputs\[0\]: the payload is not valid base64"):
        asyncio.run(fetch_all(MediaSources(), refs, chat=False))


# ---------------------------------------------------------------------------------------------
# The routes' Jobs


def client(kinds: tuple[str, ...] = ("image",), **limits) -> TestClient:
    app = create_app(
        FrontendConfig(served_model_name="m", embed_model_name="e"),
        triton=FakeTriton(),
        media_kinds=kinds,
        media=MediaSources(MediaLimits(**limits)),
    )
    return TestClient(app)


CHAT_PARTS = [
    {"type": "text", "text": "What is this?"},
    {"type": "image_url", "image_url": {"url": data_url(PNG)}},
]


def test_openai_chat_fills_job_media_and_placeholders(jobs):
    r = client().post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": CHAT_PARTS}]}
    )
    assert r.status_code == 200, r.text
    [job] = jobs
    assert job.media == (MediaItem("image", PNG, "messages[0].content[1]"),)
    assert job.messages == [
        {"role": "user", "content": [CHAT_PARTS[0], {"type": "image", "image": "<image>"}]}
    ]
    assert "base64" not in str(job.prompt_values())  # the bytes never travel as chat text


def test_openai_input_audio_and_shorthand(jobs):
    content = [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(WAV).decode(), "format": "wav"}},
        {"type": "audio_url", "audio_url": data_url(WAV, "audio/wav")},
    ]
    r = client(("audio",)).post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": content}]}
    )
    assert r.status_code == 200, r.text
    assert jobs[0].media == (
        MediaItem("audio", WAV, "messages[0].content[0]"),
        MediaItem("audio", WAV, "messages[0].content[1]"),
    )


@pytest.mark.parametrize("path", ["/serving-endpoints/m/invocations", "/serving-endpoints/chat/completions"])
def test_databricks_chat_fills_job_media(jobs, path):
    body = {"messages": [{"role": "user", "content": CHAT_PARTS}]}
    if path.endswith("completions"):
        body["model"] = "m"
    r = client().post(path, json=body)
    assert r.status_code == 200, r.text
    assert jobs[0].media == (MediaItem("image", PNG, "messages[0].content[1]"),)


def test_tgi_list_inputs_fill_prompt_parts_and_media(jobs):
    inputs = [{"type": "text", "text": "My name is"}, {"type": "image_url", "image_url": data_url(PNG)}]
    r = client().post("/", json={"inputs": inputs, "parameters": {"return_full_text": True}})
    assert r.status_code == 200, r.text
    [job] = jobs
    assert job.prompt is None and job.prompt_parts == [
        {"type": "text", "text": "My name is"},
        {"type": "image"},
    ]
    assert job.media == (MediaItem("image", PNG, "inputs[1]"),)
    assert r.json()[0]["generated_text"] == "My name isHello, world"  # the text parts, then the reply


def test_chat_api_allows_openai_chats_larger_image(jobs):
    big = {"type": "image_url", "image_url": data_url(b"x" * 40)}
    c = client(max_image_bytes=30, max_chat_image_bytes=60)
    r = c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": [big]}]})
    assert r.status_code == 200, r.text
    r = c.post("/", json={"inputs": [big]})
    assert r.status_code == 413 and r.json()["error_type"] == "payload_too_large"
    assert r.json()["error"].startswith("inputs[0]: the image is larger than 30 bytes")


# ---------------------------------------------------------------------------------------------
# Refusals in each API's format (the server-level ones: tests/e2e/test_media_api.py)


def openai_error(r) -> dict:
    assert r.status_code in (400, 413), r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error


def test_text_only_model_refuses_media_in_every_api():
    c = client(())
    chat = {"role": "user", "content": CHAT_PARTS}
    r = c.post("/v1/chat/completions", json={"model": "m", "messages": [chat]})
    error = openai_error(r)
    assert "text-only" in error["message"] and error["param"] == "messages[0].content[1]"
    error = openai_error(c.post("/serving-endpoints/m/invocations", json={"messages": [chat]}))
    assert "text-only" in error["message"] and error["param"] == "messages[0].content[1]"
    for inputs in ([{"type": "text", "text": "hi"}], CHAT_PARTS):
        r = c.post("/", json={"inputs": inputs})
        assert r.status_code == 400 and r.json()["error_type"] == "validation", r.text
        assert "this model is text-only" in r.json()["error"]
    r = c.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": CHAT_PARTS[:1]}]}
    )
    assert r.status_code == 200  # text parts stay fine


def test_refusals_name_the_part_and_reach_no_model():
    fake = FakeTriton()
    c = TestClient(
        create_app(
            FrontendConfig(served_model_name="m"), triton=fake, media_kinds=("image",), media=MediaSources()
        )
    )

    def chat(*parts):
        return c.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": list(parts)}]},
        )

    error = openai_error(chat({"type": "video_url", "video_url": "/v.mp4"}))
    assert error["param"] == "messages[0].content[0]" and "only image (image_url)" in error["message"]
    error = openai_error(chat(*[CHAT_PARTS[1]] * 21))
    assert error["param"] == "messages" and "at most 20" in error["message"]
    error = openai_error(chat({"type": "image_url", "image_url": "data:image/png;base64,%%%"}))
    assert error["param"] == "messages[0].content[0]" and "not valid base64" in error["message"]
    error = openai_error(chat({"type": "image_url", "image_url": {"url": "gopher://x/y"}}))
    assert "unsupported URL scheme 'gopher'" in error["message"]
    error = openai_error(chat({"type": "image_url", "image_url": {"url": 5}}))
    assert error["param"] == "messages[0].content[0].image_url.url"
    error = openai_error(chat({"type": "image_url", "image_url": {"url": "x", "detail": "low"}}))
    assert error["param"] == "messages[0].content[0].image_url.detail"
    error = openai_error(
        chat({"type": {}, "input_audio": {"data": "", "format": "mp3"}})
    )  # schemathesis' find
    assert error["param"] == "messages[0].content[0].type"
    error = openai_error(chat({"type": "input_audio", "input_audio": {"data": "AA==", "format": "ogg"}}))
    assert error["param"] == "messages[0].content[0].input_audio.format"
    r = c.post("/", json={"inputs": [{"type": "text", "text": "a"}] + [CHAT_PARTS[1]] * 21})
    assert r.status_code == 400 and r.json()["error"].startswith("inputs: at most 20"), r.text
    r = c.post("/", json={"inputs": [{"type": "audio_url", "audio_url": "a.wav"}]})
    assert r.status_code == 400 and r.json()["error"].startswith("inputs[0]: type 'audio_url'"), r.text
    assert not fake.calls


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("http://[::1/a.png", "not a valid URL"),
        ("http://example.com:99999/a.png", "not a valid URL"),
        ("/allowed/\x00.png", "not a readable file"),
        ("file:///allowed/%00.png", "not a readable file"),
    ],
)
def test_malformed_sources_are_refusals_not_server_errors(tmp_path, source, words):
    (tmp_path / "allowed").mkdir()
    sources = MediaSources(allowed_local_paths=[tmp_path / "allowed"])
    source = source.replace("/allowed/", f"{tmp_path}/allowed/")
    with pytest.raises(MediaError, match=words) as info:
        asyncio.run(sources.load(source, "image", "inputs[0]"))
    assert info.value.status == 400


class _Drip(http.server.BaseHTTPRequestHandler):
    """Sends a byte every 0.2 s: each read is quick, the whole body is not."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        try:
            for _ in range(30):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass  # the client gave up, as it should

    def log_message(self, *args):
        pass


def test_a_dripping_server_hits_the_fetch_deadline():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Drip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sources = MediaSources(MediaLimits(fetch_timeout_s=0.8), addresses=LOOPBACK)
        started = time.monotonic()
        with pytest.raises(MediaError, match="no 200 answer within 0.8 s"):
            asyncio.run(
                sources.load(f"http://127.0.0.1:{server.server_address[1]}/a.png", "image", "inputs[0]")
            )
        assert time.monotonic() - started < 4  # not the 6 s the body takes
    finally:
        server.shutdown()
        server.server_close()
