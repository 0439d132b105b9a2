"""Where media bytes come from: `data:` URLs, local paths / `file://` URLs under the allowed
directories, and http(s) URLs, each hop at an address the policy allows (frontend.media.addresses).
Byte limits are checked while reading, not trusted from headers. A refused or failed fetch says why
in our words, never what the target answered (its status, its error): the caller learns nothing of
what it cannot reach."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from frontend.config import FrontendConfig
from frontend.field_rules import resolved_under
from frontend.media.addresses import AddressPolicy, RefusedAddress
from tritonlm.multimodal.limits import MediaError, MediaLimits

_CHUNK = 64 * 1024
logger = logging.getLogger(__name__)


def too_large(part: str, kind: str, limit: int) -> MediaError:
    return MediaError(part, f"the {kind} is larger than {limit} bytes", status=413)


def unreadable(part: str) -> MediaError:
    return MediaError(part, "the local path is not a readable file")


@dataclass
class MediaSources:
    """`allowed_local_paths`: directories local media may come from (None or empty: local paths are
    refused). `allowed_domains`: hosts http(s) media may come from (None: any). `addresses`: the
    addresses they may resolve to."""

    limits: MediaLimits = field(default_factory=MediaLimits)
    allowed_local_paths: list[Path] | None = None
    allowed_domains: set[str] | None = None
    addresses: AddressPolicy = field(default_factory=AddressPolicy)

    @classmethod
    def from_config(cls, config: FrontendConfig) -> MediaSources:
        """From the settings ALLOWED_LOCAL_MEDIA_PATH, ALLOWED_MEDIA_DOMAINS, ALLOWED_MEDIA_NETWORKS
        and MEDIA_*."""
        return cls(
            limits=config.media_limits,
            allowed_local_paths=[Path(p).resolve() for p in config.allowed_local_media_paths] or None,
            allowed_domains={d.lower() for d in config.allowed_media_domains} or None,
            addresses=AddressPolicy(config.media_networks()),
        )

    async def load(self, url: str, kind: str, part: str, *, chat: bool = False) -> bytes:
        """The bytes of one media item of `kind` ("image", "video", "audio"); `chat`: the chat APIs'
        byte limits (MediaLimits.max_bytes)."""
        if not isinstance(url, str) or not url:
            raise MediaError(part, f"the {kind} source must be a non-empty string")
        limit = self.limits.max_bytes(kind, chat)
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (raises for a port out of range)
        except ValueError as e:
            raise MediaError(part, f"the {kind} source is not a valid URL or path") from e
        scheme = parts.scheme.lower()
        if scheme == "data":
            return _data_url(url, limit, kind, part)
        if scheme in ("http", "https"):
            return await self._fetch(url, limit, kind, part)
        if scheme == "file":
            return self._local(unquote(parts.path), limit, kind, part)
        if scheme == "":
            return self._local(url, limit, kind, part)
        raise MediaError(part, f"unsupported URL scheme {scheme!r}: use data:, http(s):, file: or a path")

    def _local(self, path: str, limit: int, kind: str, part: str) -> bytes:
        if not self.allowed_local_paths:
            raise MediaError(part, "local paths are refused: the server sets no ALLOWED_LOCAL_MEDIA_PATH")
        try:
            resolved = resolved_under(path, self.allowed_local_paths)
            if resolved is None:
                raise MediaError(part, "the local path is outside ALLOWED_LOCAL_MEDIA_PATH")
            if not resolved.is_file():
                raise unreadable(part)
            if resolved.stat().st_size > limit:
                raise too_large(part, kind, limit)
            return resolved.read_bytes()
        except (OSError, ValueError, RuntimeError) as e:  # NUL bytes, symlink loops, permissions
            if isinstance(e, MediaError):
                raise
            raise unreadable(part) from e

    async def _fetch(self, url: str, limit: int, kind: str, part: str) -> bytes:
        self._check_domain(url, part)
        timeout = self.limits.fetch_timeout_s
        # One message for every failure: no status, no error of the target's (no port scanner).
        failed = MediaError(part, f"fetching the {kind} URL failed (no 200 answer within {timeout} s)")
        try:
            # One deadline for the whole fetch, redirects included: httpx's own timeout bounds each
            # read, which a server dripping bytes would never trip. No proxy (the connection goes to
            # the address checked), no connection kept for another hop.
            async with (
                asyncio.timeout(timeout),
                httpx.AsyncClient(
                    timeout=timeout,
                    follow_redirects=False,
                    trust_env=False,
                    limits=httpx.Limits(max_keepalive_connections=0),
                ) as client,
            ):
                hop = httpx.URL(url)
                for _ in range(self.limits.max_redirects + 1):
                    pinned = await self.addresses.pin(hop)
                    request = client.build_request(
                        "GET", pinned.url, headers=pinned.headers, extensions=pinned.extensions
                    )
                    response = await client.send(request, stream=True)
                    try:
                        if response.is_redirect:
                            hop = hop.join(response.headers.get("location", ""))
                            self._check_domain(str(hop), part)
                            continue
                        if response.status_code != 200:
                            logger.info("%s: %s answered HTTP %d", part, hop.host, response.status_code)
                            raise failed
                        return await _read_capped(response, limit, kind, part)
                    finally:
                        await response.aclose()
                raise MediaError(part, f"more than {self.limits.max_redirects} redirects for the {kind} URL")
        except RefusedAddress as refused:
            raise MediaError(part, _refusal(kind, refused.address_class)) from None
        except (httpx.HTTPError, httpx.InvalidURL, TimeoutError) as error:
            logger.info("%s: fetching the %s URL failed: %s", part, kind, type(error).__name__)
            raise failed from None

    def _check_domain(self, url: str, part: str) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("http", "https"):
            raise MediaError(part, "a redirect may only lead to an http(s) URL")
        host = (parts.hostname or "").lower()
        if self.allowed_domains is not None and host not in self.allowed_domains:
            raise MediaError(part, f"the host {host!r} is not in ALLOWED_MEDIA_DOMAINS")


def _refusal(kind: str, address_class: str) -> str:
    if address_class == "unresolvable":
        return f"the {kind} URL's host does not resolve to an address"
    return (
        f"the {kind} URL's host resolves to {_article(address_class)} {address_class} address, refused; "
        "see ALLOWED_MEDIA_NETWORKS"
    )


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


async def _read_capped(response: httpx.Response, limit: int, kind: str, part: str) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(part, kind, limit)
    body = bytearray()
    async for chunk in response.aiter_bytes(_CHUNK):
        body += chunk
        if len(body) > limit:  # the header may lie or be absent
            raise too_large(part, kind, limit)
    return bytes(body)


def _data_url(url: str, limit: int, kind: str, part: str) -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.lower().endswith(";base64"):
        raise MediaError(part, "a data: URL must be base64-encoded (data:<mime>;base64,<data>)")
    if len(payload) * 3 // 4 > limit:
        raise too_large(part, kind, limit)
    return decode_base64(payload, part)


def decode_base64(payload: str, part: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError(part, "the payload is not valid base64") from e
