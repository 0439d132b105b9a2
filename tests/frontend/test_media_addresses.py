"""Media URLs refuse private addresses by default (frontend.media.addresses): every hop's resolved
addresses are checked, the connection goes to the address checked, and ALLOWED_MEDIA_NETWORKS allows
named networks. Loopback servers only; nothing here reaches another machine."""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import socket
import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from test_frontend_unit import FakeTriton

from frontend.app import create_app
from frontend.config import ConfigError, FrontendConfig
from frontend.media import MediaError, MediaLimits, MediaSources, addresses
from frontend.media.addresses import AddressPolicy, address_class

PART = "messages[0].content[1]"
IMAGE = b"\x89PNG\r\n\x1a\n not decoded by the frontend"
LOOPBACK = AddressPolicy((ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1")))


def load(sources: MediaSources, url: str) -> bytes:
    return asyncio.run(sources.load(url, "image", PART))


def refused(sources: MediaSources, url: str) -> str:
    with pytest.raises(MediaError) as info:
        load(sources, url)
    assert info.value.status == 400 and info.value.part == PART
    return str(info.value)


class _Handler(http.server.BaseHTTPRequestHandler):
    """/img.png (the Host header it was sent is kept in `hosts`), /missing (404), /to?url (302)."""

    hosts: list[str] = []

    def do_GET(self):  # noqa: N802
        if self.path == "/img.png":
            _Handler.hosts.append(self.headers["Host"])
            self.send_response(200)
            self.send_header("Content-Length", str(len(IMAGE)))
            self.end_headers()
            self.wfile.write(IMAGE)
        elif self.path.startswith("/to?"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/to?"))
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args):
        pass


class _Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve(host: str) -> Iterator[str]:
    server_class = _Server6 if ":" in host else http.server.ThreadingHTTPServer
    try:
        server = server_class((host, 0), _Handler)
    except OSError as error:
        pytest.skip(f"cannot listen on {host} here: {error}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{'[' + host + ']' if ':' in host else host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    yield from serve("127.0.0.1")


def test_each_class_of_address():
    cases = {
        "127.0.0.1": "loopback",
        "127.9.9.9": "loopback",
        "::1": "loopback",
        "10.1.2.3": "private",
        "172.16.0.1": "private",
        "192.168.1.1": "private",
        "fc00::1": "private",
        "fd12:3456::1": "private",
        "169.254.169.254": "link-local",  # the clouds' metadata address
        "fe80::1": "link-local",
        "0.0.0.0": "unspecified",
        "::": "unspecified",
        "100.64.0.1": "shared",
        "224.0.0.1": "multicast",
        "ff02::1": "multicast",
        "240.0.0.1": "reserved",
        "255.255.255.255": "reserved",
        "192.0.2.1": "reserved",  # documentation
        "::ffff:127.0.0.1": "loopback",  # IPv4-mapped
        "::ffff:169.254.169.254": "link-local",
        "::ffff:10.0.0.1": "private",
        "2002:7f00:1::": "loopback",  # 6to4 of 127.0.0.1
        "64:ff9b::a9fe:a9fe": "link-local",  # NAT64 of 169.254.169.254
        "::7f00:1": "loopback",  # IPv4-compatible
        "8.8.8.8": None,
        "2606:4700:4700::1111": None,
        "::ffff:8.8.8.8": None,
    }
    for text, expected in cases.items():
        assert address_class(ipaddress.ip_address(text)) == expected, text


def test_loopback_link_local_and_metadata_addresses_are_refused_by_default(web):
    sources = MediaSources(MediaLimits(fetch_timeout_s=5))
    for url, what in (
        (f"{web}/img.png", "a loopback address"),
        ("http://[::1]:9/img.png", "a loopback address"),  # refused before any connection
        ("http://[::ffff:127.0.0.1]:9/img.png", "a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "a link-local address"),
        ("https://169.254.169.254/", "a link-local address"),
        ("http://0.0.0.0:9/", "an unspecified address"),
        ("http://2130706433/img.png", "a loopback address"),  # 127.0.0.1 as one number
    ):
        message = refused(sources, url)
        assert (
            message == f"{PART}: the image URL's host resolves to {what}, refused; see ALLOWED_MEDIA_NETWORKS"
        )


def test_a_name_is_judged_by_every_address_it_resolves_to(web, monkeypatch):
    port = web.rsplit(":", 1)[1]
    assert "a loopback address" in refused(MediaSources(), f"http://localhost:{port}/img.png")

    async def resolve(host: str, port: int) -> list:
        answers = {"inside.example": ["127.0.0.1"], "both.example": ["93.184.215.14", "10.0.0.7"]}
        return [ipaddress.ip_address(a) for a in answers[host]]

    monkeypatch.setattr(addresses, "resolve", resolve)
    assert "a loopback address" in refused(MediaSources(), f"http://inside.example:{port}/img.png")
    assert "a private address" in refused(MediaSources(), "http://both.example/img.png")


def test_the_connection_goes_to_the_address_checked_under_the_urls_name(web, monkeypatch):
    """The name resolves (here) to 127.0.0.1 only: the fetch reaches that address, and the server
    sees the URL's name as the Host."""
    port = web.rsplit(":", 1)[1]

    async def resolve(host: str, port: int) -> list:
        assert host == "media.example"
        return [ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(addresses, "resolve", resolve)
    _Handler.hosts.clear()
    assert load(MediaSources(addresses=LOOPBACK), f"http://media.example:{port}/img.png") == IMAGE
    assert _Handler.hosts == [f"media.example:{port}"]


def test_every_redirect_hop_is_checked():
    """An allowed server (127.0.0.2, the only network allowed) redirects to 127.0.0.1: refused."""
    allowed = AddressPolicy((ipaddress.ip_network("127.0.0.2/32"),))
    for base in serve("127.0.0.2"):
        sources = MediaSources(addresses=allowed)
        assert load(sources, f"{base}/img.png") == IMAGE
        message = refused(sources, f"{base}/to?http://127.0.0.1:9/img.png")
        assert "a loopback address, refused" in message
        assert "a link-local address" in refused(sources, f"{base}/to?http://169.254.169.254/")


def test_allowed_networks_fetch_and_failures_say_nothing_of_the_answer(web):
    sources = MediaSources.from_config(FrontendConfig(allowed_media_networks=("127.0.0.0/8",)))
    assert load(sources, f"{web}/img.png") == IMAGE
    assert load(sources, f"{web}/to?/img.png") == IMAGE  # a redirect within the allowed network
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    missing, refused_connection = (
        refused(sources, f"{web}/missing"),
        refused(sources, f"http://127.0.0.1:{port}/"),
    )
    assert (
        missing
        == refused_connection
        == (
            f"{PART}: fetching the image URL failed (no 200 answer within {sources.limits.fetch_timeout_s} s)"
        )
    )


def test_allowed_ipv6_loopback():
    for base in serve("::1"):
        assert load(MediaSources(addresses=LOOPBACK), f"{base}/img.png") == IMAGE
        assert "a loopback address" in refused(MediaSources(), f"{base}/img.png")


def test_the_setting_is_checked_at_start():
    config = FrontendConfig.load([], {"ALLOWED_MEDIA_NETWORKS": "127.0.0.0/8, ::1,10.0.0.5"})
    assert [str(n) for n in config.media_networks()] == ["127.0.0.0/8", "::1/128", "10.0.0.5/32"]
    with pytest.raises(ConfigError, match=r"ALLOWED_MEDIA_NETWORKS .*'localhost' is not an IP network"):
        FrontendConfig.load([], {"ALLOWED_MEDIA_NETWORKS": "localhost"})


def test_each_api_answers_the_refusal_as_a_400_in_its_own_format(web):
    app = create_app(FrontendConfig(served_model_name="m"), triton=FakeTriton(), media_kinds=("image",))
    url = f"{web}/img.png"
    says = "the image URL's host resolves to a loopback address, refused; see ALLOWED_MEDIA_NETWORKS"
    with TestClient(app) as client:
        chat = {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        }
        r = client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
        r = client.post("/", json={"inputs": [{"type": "image_url", "image_url": {"url": url}}]})
        assert r.status_code == 400 and says in r.json()["error"], r.text
        image = {"type": "image", "source": {"type": "url", "url": url}}
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [image]}]}
        r = client.post("/v1/messages", json=body)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
