"""What counts as loopback, a Host's name, and a same-origin request (app/auth/exposure.py)."""

from __future__ import annotations

import pytest

from app.auth.exposure import Exposure, host_name, is_loopback


@pytest.mark.parametrize(
    ("value", "name"),
    [("localhost:8000", "localhost"), ("[::1]:8000", "::1"), ("[::1]", "::1"), ("::1", "::1"),
     ("127.0.0.1", "127.0.0.1"), ("Example.COM:80", "example.com")],
)  # fmt: skip
def test_host_names(value: str, name: str) -> None:
    assert host_name(value) == name


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("::ffff:127.0.0.1", True), ("app.localhost", True), ("localhost.", True), ("::ffff:10.0.0.1", False),
     ("localhost.example.com", False), ("", False)],
)  # fmt: skip
def test_more_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def refusal(headers: list[tuple[bytes, bytes]], allowed: tuple[str, ...] = ()) -> str | None:
    err = Exposure("off", allowed).refusal({"type": "http", "headers": headers})
    return None if err is None else err.slug


@pytest.mark.parametrize(
    ("headers", "slug"),
    [
        ([(b"host", b"127.0.0.1:8000")], None),
        ([], None),  # HTTP/1.0 without Host: no browser sends that
        ([(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")], None),
        ([(b"host", b"127.0.0.1:8000"), (b"origin", b"https://127.0.0.1:8000/")], None),
        ([(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8001")], "foreign-origin"),
        ([(b"host", b"127.0.0.1:8000"), (b"origin", b"null")], "foreign-origin"),
        ([(b"origin", b"http://127.0.0.1:8000")], "foreign-origin"),
        ([(b"host", b"evil.example")], "host-not-allowed"),
        ([(b"host", b"127.0.0.1"), (b"x-real-ip", b"1.2.3.4")], "proxy-without-keys"),
    ],
)
def test_what_an_open_service_refuses(headers: list[tuple[bytes, bytes]], slug: str | None) -> None:
    assert refusal(headers) == slug


def test_keys_required_unless_the_socket_is_loopback() -> None:
    auto = Exposure("auto")
    assert auto.keys_required({"server": ("10.0.0.5", 8000)})
    assert auto.keys_required({"server": ("/run/jobq.sock", None)})
    assert auto.keys_required({})
    assert not Exposure("off").keys_required({"server": ("10.0.0.5", 8000)})
    assert Exposure("on").keys_required({"server": ("127.0.0.1", 8000)})
