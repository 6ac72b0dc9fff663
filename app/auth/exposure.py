"""Whether a request needs an API key, decided by the socket it arrived on, and what a service running
open (without keys) refuses so that only its own machine can use it.

JOBQ_AUTH=auto requires keys on every connection except those made to a loopback address of a socket that
listens on loopback only. The sockets decide, never a setting: the request's ASGI `server` (this
connection's local address) must be a loopback address, and the process's listening socket on that port
must be bound to one too (not to 0.0.0.0 or ::, where a connection from this machine arrives on
127.0.0.1 as well). So `uvicorn app.main:create_app --factory --host 0.0.0.0` requires keys although
nobody set JOBQ_HOST, and `jobq serve` on 127.0.0.1 or ::1 runs open. A server address that is unknown or
not an IP address (a Unix socket) requires keys: fail closed.

An open service is reachable from its own machine only, so three ways in from further away stay shut:
  * a proxy on the same host forwarding the world to 127.0.0.1: requests carrying Forwarded,
    X-Forwarded-For or X-Real-IP are refused (403 `proxy-without-keys`), with the way to turn keys on;
  * DNS rebinding (a web page whose host name resolves to 127.0.0.1 reading the API through it): only
    loopback names and addresses, and JOBQ_ALLOWED_HOSTS, are answered in `Host` (421);
  * cross-site requests from a page the operator visits: a foreign `Origin` is refused (403), and the
    Content-Type rules of app/http/fastpath.py RequestGuard stop the "simple" requests a form can send.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
from collections.abc import Iterable
from typing import Literal

from starlette.types import Scope

from app.errors import AppError, ForeignOrigin, HostNotAllowed, ProxyWithoutKeys

log = logging.getLogger("jobq.auth")

AuthMode = Literal["auto", "on", "off"]
PROXY_HEADERS = frozenset({b"forwarded", b"x-forwarded-for", b"x-real-ip"})
TURN_KEYS_ON = (
    "Turn API keys on: set JOBQ_AUTH=on, then create a key (`jobq keys create --name NAME --scope admin`) or set "
    "JOBQ_API_KEY, and send it as `Authorization: Bearer <key>`."
)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z), `localhost` and `*.localhost` (RFC 6761). Any other name
    or address, 0.0.0.0 and :: included, counts as exposed."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


# A Host value as a client that means it sends one (RFC 9110 7.2): a DNS name or IPv4 address, or an IPv6
# address in brackets (bare too, as host_name() reads it), then an optional port. Nothing else is parsed
# leniently into a loopback name: `[::1]evil.example`, `[::1`, `localhost:1, evil.example` are refused.
_HOST_SYNTAX = re.compile(r"(?:[a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::[0-9]*)?|[0-9a-f:.]*:[0-9a-f:.]*:[0-9a-f:.]*", re.I)


def host_name(authority: str) -> str:
    """The host of a `Host` value or URL authority, without port or brackets: `[::1]:8000` -> `::1`."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    if authority.count(":") == 1:  # name:port; a bare IPv6 address has more colons
        return authority.partition(":")[0]
    return authority


class Exposure:
    """Decides per request whether keys are required, and what an open request is refused for."""

    def __init__(self, mode: AuthMode, allowed_hosts: Iterable[str] = ()) -> None:
        self.mode = mode
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self._open: dict[object, bool] = {}  # server host -> open? (a process binds a handful of addresses)
        self._hosts: dict[bytes, bool] = {}  # Host value -> answered? (parsing an address costs ~10 µs)

    def keys_required(self, scope: Scope) -> bool:
        if self.mode != "auto":
            return self.mode == "on"
        server = scope.get("server")
        # A Unix socket's server is (path, None): not an IP address, so keys are required.
        key = (server[0], server[1]) if server and server[1] is not None else None
        opened = self._open.get(key)
        if opened is None:
            opened = self._open[key] = key is not None and _open_socket(key[0], key[1])
            if opened:
                log.warning(
                    "serving without API keys on %s port %s (loopback, JOBQ_AUTH=auto): any process on this "
                    "machine may use every queue",
                    *(key or ()),
                )
        return not opened

    def refusal(self, scope: Scope) -> AppError | None:
        """Why an open request is refused, if it is: a proxy's headers, a foreign Host, a foreign Origin."""
        host: bytes | None = None
        origin: bytes | None = None
        hosts = origins = 0
        for name, value in scope["headers"]:
            if name in PROXY_HEADERS:
                return ProxyWithoutKeys(
                    "This jobq runs without API keys, which is safe only while nothing but this machine can reach "
                    f"it, and this request came through a proxy (it carries `{name.decode()}`). " + TURN_KEYS_ON
                )
            if name == b"host":
                host = value
                hosts += 1
            elif name == b"origin":
                origin = value
                origins += 1
        # More than one Host or Origin: no browser sends that, and which one counts is anybody's guess.
        if host is not None and (hosts > 1 or not self._host_allowed(host)):
            return HostNotAllowed(
                "This jobq runs without API keys and answers only requests addressed to this machine by a "
                "loopback name or address (localhost, 127.0.0.1, [::1]) or a name in JOBQ_ALLOWED_HOSTS. "
                + TURN_KEYS_ON
            )
        if origin is not None and (origins > 1 or not _same_origin(origin.decode("latin-1"), host)):
            return ForeignOrigin(
                "This jobq runs without API keys and refuses requests that a web page of another origin makes. "
                + TURN_KEYS_ON
            )
        return None

    def _host_allowed(self, value: bytes) -> bool:
        allowed = self._hosts.get(value)
        if allowed is None:
            text = value.decode("latin-1").strip()
            name = host_name(text).rstrip(".")
            allowed = "*" in self.allowed_hosts or (
                _HOST_SYNTAX.fullmatch(text) is not None and (is_loopback(name) or name in self.allowed_hosts)
            )
            if len(self._hosts) >= 256:  # made-up Host values cannot grow it without bound
                self._hosts.clear()
            self._hosts[value] = allowed
        return allowed


def _open_socket(host: str, port: int) -> bool:
    """A connection to host:port may run open: it arrived on a loopback address, and every socket of this
    process listening on that port is bound to a loopback address (when they can be found)."""
    if not is_loopback(host):
        return False
    bound = listening_hosts(port)
    return all(is_loopback(h) for h in bound)


def listening_hosts(port: int) -> set[str]:
    """The addresses this process's listening TCP sockets on `port` are bound to (0.0.0.0 and :: included);
    empty where its file descriptors cannot be listed. Looked through once per port and process."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            fds = [int(name) for name in os.listdir(folder)]
            break
        except (OSError, ValueError):
            continue
    else:
        return set()
    hosts = set()
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)  # wraps the descriptor without taking it over: detached below
        except OSError:  # not a socket (or closed meanwhile)
            continue
        try:
            if (
                sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and sock.getsockname()[1] == port
            ):
                hosts.add(sock.getsockname()[0])
        except OSError:
            pass
        finally:
            sock.detach()
    return hosts


def _same_origin(origin: str, host: bytes | None) -> bool:
    """The page's origin is this service itself: `http(s)://` + exactly the request's Host. `null` (a
    sandboxed frame, a file) never is."""
    scheme, sep, authority = origin.strip().lower().partition("://")
    if not sep or scheme not in ("http", "https") or host is None:
        return False
    return authority.rstrip("/") == host.decode("latin-1").strip().lower()
