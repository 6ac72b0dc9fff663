"""Who sent a request, for the access log: the peer's address, or, when the peer is a proxy listed in
JOBQ_TRUSTED_PROXIES, the address that proxy names in X-Forwarded-For (or Forwarded: for=).

Forwarding headers are read right to left, skipping addresses that are themselves trusted proxies: the
first address that is not one is the client (anything further left was written by the client itself
and proves nothing). A peer that is not trusted is the client, whatever its headers say."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from starlette.types import Scope

_FOR = re.compile(r'for="?\[?([^]";,]+)', re.IGNORECASE)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip().strip('"')
    if text.startswith("["):  # [v6]:port
        text = text[1 : text.find("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class ClientAddress:
    def __init__(self, trusted: Iterable[str]) -> None:
        self.trusted = [ipaddress.ip_network(t, strict=False) for t in trusted]

    def _trusted(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
        return address is not None and any(address in net for net in self.trusted if net.version == address.version)

    def of(self, scope: Scope) -> str | None:
        client = scope.get("client")
        peer: str | None = str(client[0]) if client else None
        if not self.trusted or peer is None or not self._trusted(_address(peer)):
            return peer
        chain: list[str] = []
        forwarded: list[str] = []
        for name, value in scope["headers"]:
            if name == b"x-forwarded-for":
                chain += value.decode("latin-1").split(",")
            elif name == b"forwarded":
                forwarded += _FOR.findall(value.decode("latin-1"))
        for hop in reversed(chain or forwarded):
            address = _address(hop)
            if address is None:
                return peer  # an unreadable hop: trust nothing past it
            if not self._trusted(address):
                return str(address)
        return peer
