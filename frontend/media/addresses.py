"""Which addresses an http(s) media URL may reach, and each hop pinned to the address checked.

The frontend fetches media URLs from inside its own network: unchecked, a request could have it read
`http://127.0.0.1:8000/…` or a cloud's metadata address (a server-side request forgery). So each hop
(the URL, then every redirect) is resolved here, every address its host resolves to is checked, and
the connection goes to the checked address, with the URL's name kept as the Host header and as TLS's
server name (the certificate is verified against it): a DNS answer cannot change between the check
and the fetch. Refused, unless ALLOWED_MEDIA_NETWORKS holds the address: unspecified, loopback,
private (RFC 1918, fc00::/7), link-local (169.254.0.0/16, with the clouds' metadata address; fe80::/10),
shared (100.64.0.0/10), multicast, and every other address that is not globally reachable (reserved,
documentation, benchmarking); an IPv6 address that carries an IPv4 one (mapped, 6to4, NAT64,
compatible) is judged by that one too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The classes refused by name, first match wins; any other address that is not global is "reserved".
_CLASSES: tuple[tuple[str, tuple[Network, ...]], ...] = tuple(
    (name, tuple(ipaddress.ip_network(n) for n in networks))
    for name, networks in (
        ("unspecified", ("0.0.0.0/8", "::/128")),
        ("loopback", ("127.0.0.0/8", "::1/128")),
        ("private", ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10")),
        ("link-local", ("169.254.0.0/16", "fe80::/10")),
        ("shared", ("100.64.0.0/10",)),
        ("multicast", ("224.0.0.0/4", "ff00::/8")),
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE = ipaddress.ip_network("::/96")  # IPv4-compatible (deprecated), :: and ::1 aside


class RefusedAddress(ValueError):
    """A hop's host resolves to an address of a refused class (`address_class`), or to none."""

    def __init__(self, address_class: str) -> None:
        super().__init__(address_class)
        self.address_class = address_class


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64, compatible), if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped or address.sixtofour:
        return address.ipv4_mapped or address.sixtofour
    if address in _NAT64 or (address in _COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_class(address: IPAddress) -> str | None:
    """The refused class of `address` ("loopback", "private", …), None for a global address."""
    address = embedded_ipv4(address) or address  # where a carried IPv4 address leads
    for name, networks in _CLASSES:
        if any(address in network for network in networks):
            return name
    return None if address.is_global else "reserved"


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to (an address literal: itself); OSError when none."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


@dataclass(frozen=True)
class Hop:
    """One request of a fetch, pinned: `url` names the checked address, `headers` and `extensions`
    keep the name (Host; TLS's server name, which the certificate must match)."""

    url: httpx.URL
    headers: dict[str, str]
    extensions: dict[str, str]


@dataclass(frozen=True)
class AddressPolicy:
    """The refused address classes, less `allowed` (ALLOWED_MEDIA_NETWORKS)."""

    allowed: tuple[Network, ...] = ()

    def refusal(self, address: IPAddress) -> str | None:
        """The class `address` is refused as, None when it may be reached."""
        carried = embedded_ipv4(address)
        if any(address in network or (carried and carried in network) for network in self.allowed):
            return None
        return address_class(address)

    async def pin(self, url: httpx.URL) -> Hop:
        """`url` to fetch at an address its host resolves to, every one of them checked first;
        RefusedAddress says which class refused it ("unresolvable": none)."""
        host = url.raw_host.decode("ascii")  # an international name in its DNS form
        try:
            addresses = await resolve(host, url.port or (443 if url.scheme == "https" else 80))
        except (OSError, UnicodeError, ValueError):
            addresses = []
        if not addresses:
            raise RefusedAddress("unresolvable")
        for address in addresses:
            if refused := self.refusal(address):
                raise RefusedAddress(refused)
        extensions = {"sni_hostname": host} if url.scheme == "https" else {}
        pinned = url.copy_with(host=str(addresses[0]))
        return Hop(pinned, {"Host": url.netloc.decode("ascii")}, extensions)
