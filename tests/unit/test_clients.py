"""Whose address the access log names (app/observability/clients.py)."""

from __future__ import annotations

import pytest

from app.observability.clients import ClientAddress


def client(trusted: list[str], peer: str, *headers: tuple[bytes, bytes]) -> str | None:
    return ClientAddress(trusted).of({"client": (peer, 5000), "headers": list(headers)})


XFF = b"x-forwarded-for"


@pytest.mark.parametrize(
    ("trusted", "peer", "headers", "expected"),
    [
        ([], "10.0.0.2", [(XFF, b"203.0.113.9")], "10.0.0.2"),  # no proxy is trusted: headers ignored
        (["10.0.0.0/8"], "192.0.2.1", [(XFF, b"203.0.113.9")], "192.0.2.1"),  # this peer is not a trusted proxy
        (["10.0.0.0/8"], "10.0.0.2", [(XFF, b"203.0.113.9")], "203.0.113.9"),
        (["10.0.0.0/8"], "10.0.0.2", [(XFF, b"6.6.6.6, 203.0.113.9, 10.0.0.7")], "203.0.113.9"),  # left: forged
        (["10.0.0.0/8"], "10.0.0.2", [(XFF, b"6.6.6.6"), (XFF, b"203.0.113.9")], "203.0.113.9"),
        (["10.0.0.0/8"], "10.0.0.2", [(b"forwarded", b'for="[2001:db8::1]:4711";proto=https')], "2001:db8::1"),
        (["10.0.0.0/8"], "10.0.0.2", [(b"forwarded", b"for=198.51.100.3, for=10.0.0.9")], "198.51.100.3"),
        (["10.0.0.0/8"], "10.0.0.2", [(XFF, b"garbage")], "10.0.0.2"),
        (["10.0.0.0/8"], "10.0.0.2", [], "10.0.0.2"),
        (["::1"], "::1", [(XFF, b"203.0.113.9:1234")], "203.0.113.9"),
    ],
)
def test_the_client_is_the_first_untrusted_hop(
    trusted: list[str], peer: str, headers: list[tuple[bytes, bytes]], expected: str
) -> None:
    assert client(trusted, peer, *headers) == expected
