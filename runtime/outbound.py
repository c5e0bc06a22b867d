"""Where a client of ``agentcell serve`` may make the server connect (design §9).

A URL a client gives (an MCP server's) is reached only if the host's policy lists it
(``server.mcp_allowed_urls``), and never at a loopback, private, link-local, shared, reserved or multicast
address (cloud metadata services live there: ``169.254.169.254``, ``fd00:ec2::254``) unless the policy names
that host itself. A host name is judged by every address it resolves to, so a name pointing inside, the
decimal, octal or short forms of an IPv4 address (``2130706433``, ``0x7f.1``, ``127.1``) and IPv6 forms of
one (``::ffff:127.0.0.1``, ``2002:7f00:1::``) are all caught. The MCP client applies the same rule at
every connection of a client's server (so a name that resolves elsewhere the second time is caught too).

Pure logic, except :func:`resolve` (DNS).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Literal
from urllib.parse import urlsplit

from runtime.errors import AddressRefused

__all__ = [
    "AddressRefused",
    "UrlRule",
    "check_allowed_urls",
    "check_public",
    "match_url",
    "refused_reason",
    "resolve",
    "url_host",
]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

UrlRule = Literal["named", "open"]
"""How a URL is allowed: ``named`` (the policy names its host: any address it has), ``open`` (by ``*``:
public addresses only)."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


def refused_reason(address: IpAddress) -> str | None:
    """Why a connection to ``address`` is not made for a client (``"loopback"``, ``"private"``...), or
    None for a public address. IPv4 addresses inside IPv6 (mapped, 6to4, Teredo) are judged as IPv4."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if address.teredo is not None:
            inner = address.teredo[1]
        if inner is not None:
            return refused_reason(inner)
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_unspecified:
        return "unspecified"
    if address.is_private:
        return "private"
    if not address.is_global:
        return "reserved"  # shared (100.64/10), documentation, benchmarking...
    return None


def check_public(host: str, addresses: Iterable[str], tolerate: frozenset[str] = frozenset()) -> None:
    """:class:`AddressRefused` unless every one of ``addresses`` (what ``host`` resolved to) is public, or
    of a kind ``tolerate`` names (``"loopback"``, ``"private"``)."""
    for text in addresses:
        address = ipaddress.ip_address(text.partition("%")[0])  # (an IPv6 scope id is not part of it)
        reason = refused_reason(address)
        if reason is not None and reason not in tolerate:
            shown = host if host == text else f"{host} ({text})"
            raise AddressRefused(f"{shown} is a {reason} address")


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (blocking DNS); :class:`AddressRefused` when it does not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise AddressRefused(f"cannot resolve {host}: {exc}") from None
    return sorted({str(info[4][0]) for info in infos})


def _origin(url: str) -> tuple[str, str, int, str]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower().rstrip(".")
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme, 0)
    except ValueError:
        port = -1
    return scheme, host, port, parts.path or "/"


def check_allowed_urls(entries: Sequence[str]) -> None:
    """A ``ValueError`` naming the first entry of an allow-list that is neither ``*`` nor an http(s) URL
    with a host."""
    for entry in entries:
        if entry == "*":
            continue
        scheme, host, port, _ = _origin(entry)
        if scheme not in _DEFAULT_PORTS or not host or port < 0 or "@" in urlsplit(entry).netloc:
            raise ValueError(f"{entry!r} is not '*' or an http(s) URL with a host (and no user or password)")


def match_url(url: str, allowed: Sequence[str]) -> UrlRule | None:
    """How ``url`` is allowed by the list ``allowed`` (see :data:`UrlRule`), or None.

    An entry is ``*`` (any http(s) URL, at a public address) or a URL: same scheme, host and port, and a
    path under the entry's (``https://mcp.example.com/tools/`` allows ``.../tools/x``, not ``/toolsx``)."""
    scheme, host, port, path = _origin(url)
    if scheme not in _DEFAULT_PORTS or not host or port < 0:
        return None
    if "@" in urlsplit(url).netloc:  # user information: confusing (``https://good.example@evil``): refused
        return None
    for entry in allowed:
        if entry == "*":
            continue
        e_scheme, e_host, e_port, e_path = _origin(entry)
        if (e_scheme, e_host, e_port) != (scheme, host, port):
            continue
        if path == e_path or path.startswith(e_path if e_path.endswith("/") else e_path + "/"):
            return "named"
    return "open" if "*" in allowed else None


def url_host(url: str) -> tuple[str, int]:
    """The host and port ``url`` connects to."""
    _, host, port, _ = _origin(url)
    return host, port
