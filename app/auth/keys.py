"""API keys as text: their format, how one is made, and how a request carries one.

A key is "jobq_<selector>_<secret>": the selector (48 bits, not secret) finds the row; the secret (256
bits) is checked against its SHA-256 in constant time. A fast hash suffices: the secret is random, not a
password. The key itself is never stored and cannot be recovered."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable

KEY_PREFIX = "jobq_"
_KEY = re.compile(r"jobq_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_key() -> tuple[str, str, bytes]:
    """(key, selector, SHA-256 of its secret). The key is shown once; only the selector and hash are kept."""
    selector = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return f"{KEY_PREFIX}{selector}_{secret}", selector, digest(secret)


def parse_key(token: str) -> tuple[str, str] | None:
    """(selector, secret) of a well-formed jobq key, else None."""
    m = _KEY.fullmatch(token)
    return (m.group(1), m.group(2)) if m else None


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of `Authorization: Bearer <token>` (scheme case-insensitive, RFC 6750); else None."""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None
