"""API keys as text: their format, how one is made, how a request carries one, and the AWS pair derived from one.

A key is "jobq_<selector>_<secret>": the selector (48 bits, not secret) finds the row; the secret (256
bits) is checked against its SHA-256 in constant time. A fast hash suffices: the secret is random, not a
password. The key itself is never stored and cannot be recovered."""

from __future__ import annotations

import base64
import hashlib
import hmac
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


# -- the pair an AWS SDK signs SQS requests with (app/auth/sigv4.py) -----------------------------------------
#
# The access key id names the key's selector; the secret is derived from the server's JOBQ_SQS_SERVER_SECRET,
# the selector and the key's id, so that nothing new is stored: the verifier derives it again for each request
# from the key's row. Revoking the key revokes its pair; changing the server secret changes every pair. The id
# is in the derivation so that a selector reused (were a revoked row ever deleted) never gets the old secret.

SQS_ACCESS_KEY_PREFIX = "JOBQ"
_SQS_ACCESS_KEY = re.compile(r"JOBQ([0-9A-F]{12})")
_SQS_CONTEXT = b"jobq-sqs-v1\0"


def sqs_access_key_id(selector: str) -> str:
    """`JOBQ` and the selector in capitals: 16 characters of [A-Z0-9], the form IAM's access key ids take."""
    return SQS_ACCESS_KEY_PREFIX + selector.upper()


def sqs_selector(access_key_id: str) -> str | None:
    """The selector an access key id names, else None."""
    m = _SQS_ACCESS_KEY.fullmatch(access_key_id)
    return m.group(1).lower() if m else None


def sqs_secret(server_secret: str, selector: str, key_id: int) -> str:
    """The secret access key of a jobq key: HMAC-SHA256 of the server secret over (selector, id), base64url."""
    mac = hmac.new(server_secret.encode(), _SQS_CONTEXT + f"{selector}\0{key_id}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()
