"""Which ``Host`` a request to the daemon's HTTP port may name: the defence against DNS rebinding.

A web page of another site can make a browser send requests to the daemon by pointing a name of its own at
the daemon's address (DNS rebinding); the browser then treats the answers as that site's own and lets its
script read them. Such a request always carries the attacker's name in ``Host``.

Invariants:
- A request is served only when its ``Host`` (less any ``:port``; an IPv6 address in brackets) is one of the
  allowed names or addresses; anything else, a missing or malformed ``Host`` included, is answered 421 before
  any route runs, the anonymous endpoints included.
- The allowed set is ``--http-allowed-hosts`` when given, else the ``--http`` host, the addresses the
  endpoint is bound to and ``localhost``. Bound to a wildcard address (``0.0.0.0``, ``::``), the default
  accepts any literal IP address (a literal address cannot be rebound to another server) and ``localhost``,
  never another name.
- Names compare case-insensitively, without a trailing dot; addresses compare as addresses (``::1`` and
  ``0:0::1`` are the same).

Starlette's TrustedHostMiddleware cuts ``Host`` at the first colon (an IPv6 ``Host`` becomes ``[``) and
answers 400, hence this module.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

NAME = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?:\.(?!-)[a-z0-9_-]{1,63})*")
PORT = re.compile(r"[0-9]{1,5}")
MISDIRECTED = b"misdirected request: this server does not answer to that Host (--http-allowed-hosts)\n"


def _address(text: str) -> Address | None:
    """A literal address (an IPv4-mapped IPv6 one as its IPv4 address), or None."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _normal_name(text: str) -> str | None:
    """A host name lower-cased without its trailing dot; None when it is not a valid name."""
    name = text.lower().removesuffix(".")
    return name if len(name) <= 253 and NAME.fullmatch(name) else None


def host_of(header: str) -> str | Address | None:
    """The name or address a ``Host`` value names (``name``, ``name:port``, ``1.2.3.4:port``, ``[::1]:port``),
    or None when it is malformed."""
    if header.startswith("["):
        inside, sep, rest = header[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and PORT.fullmatch(rest[1:]))):
            return None
        return _address(inside) if ":" in inside else None
    host, sep, port = header.partition(":")
    if sep and not PORT.fullmatch(port):
        return None  # a bare IPv6 address, or a bad port
    return _address(host) or _normal_name(host)


def parse_allowed(entry: str) -> str | Address:
    """One ``--http-allowed-hosts`` entry (a name, an address, ``[v6]``); raises ValueError naming it."""
    text = entry.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    value = _address(bare) or _normal_name(bare)
    if value is None:
        raise ValueError(f"{entry!r} is not a host name or an IP address (no port, no wildcard)")
    return value


@dataclass(frozen=True)
class AllowedHosts:
    names: frozenset[str]
    addresses: frozenset[Address]
    any_address: bool = False  # bound to a wildcard address, default list: every literal address

    @classmethod
    def of(cls, entries: Iterable[str]) -> AllowedHosts:
        """The set of ``--http-allowed-hosts``; raises ValueError naming a bad entry."""
        values = [parse_allowed(part) for entry in entries for part in entry.split(",") if part.strip()]
        if not values:
            raise ValueError("--http-allowed-hosts needs at least one name or address")
        return cls(frozenset(v for v in values if isinstance(v, str)),
                   frozenset(v for v in values if not isinstance(v, str)))

    @classmethod
    def default(cls, bound_host: str, bound_addresses: Iterable[str] = ()) -> AllowedHosts:
        """``localhost``, the ``--http`` host and the addresses it was bound to; any literal address (and
        ``localhost``) for a wildcard bind."""
        values = [parse_allowed(bound_host), *(parse_allowed(a) for a in bound_addresses)]
        addresses = frozenset(v for v in values if not isinstance(v, str))
        if any(a.is_unspecified for a in addresses):
            return cls(frozenset({"localhost"}), frozenset(), any_address=True)
        return cls(frozenset({"localhost", *(v for v in values if isinstance(v, str))}), addresses)

    def allows(self, header: str | None) -> bool:
        host = host_of(header) if header else None
        if host is None:
            return False
        if isinstance(host, str):
            return host in self.names
        return self.any_address or host in self.addresses

    def describe(self) -> str:
        """For the start line: the names and addresses, sorted."""
        shown = sorted(self.names) + sorted(str(a) for a in self.addresses)
        return ",".join(shown + (["any IP address"] if self.any_address else []))


class HostCheck:
    """ASGI middleware: 421 for a request whose ``Host`` is not allowed."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts):
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            values = [value for name, value in scope["headers"] if name == b"host"]
            header = values[0].decode("latin-1") if len(values) == 1 else None  # two Hosts: malformed
            if not self.allowed.allows(header):
                await send({"type": "http.response.start", "status": 421, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close"),
                    (b"cache-control", b"no-store")]})
                await send({"type": "http.response.body", "body": MISDIRECTED})
                return
        await self.app(scope, receive, send)
