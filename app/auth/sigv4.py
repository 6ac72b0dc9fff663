"""AWS Signature Version 4 for the SQS endpoint: who signed a request, checked against its jobq key's pair.

An SQS request proves its key by signing, not by sending a secret: `Authorization: AWS4-HMAC-SHA256
Credential=<access key id>/<date>/<region>/sqs/aws4_request, SignedHeaders=..., Signature=...` (what every
AWS SDK sends), or the same fields as X-Amz-* query parameters (a presigned URL). The access key id names a
jobq key (app/auth/keys.py); its secret is derived from JOBQ_SQS_SERVER_SECRET, so the verifier derives it
again from the key's row rather than reading anything stored. Checks, in order, each with SQS's own code:

    IncompleteSignature (400)      the signature's fields are missing or malformed
    RequestExpired (400)           dated more than 5 minutes off (presigned: past X-Amz-Expires)
    InvalidClientTokenId (403)     no such live key (unknown, revoked), or no server secret to derive from
    SignatureDoesNotMatch (403)    anything signed was changed, or the secret is wrong
    MissingAuthenticationToken     no signature at all

The region is whatever the client signed with (jobq is not regional); it is part of the signing key, so a
region changed in transit fails like any other change. The canonical request follows AWS's specification
for services other than S3: the path normalised and URI-encoded once more, the query re-encoded and
sorted, signed headers trimmed; the payload is the body's SHA-256, or what `x-amz-content-sha256` says
(UNSIGNED-PAYLOAD, or a digest that must be the body's).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Protocol
from urllib.parse import quote, quote_from_bytes, unquote_to_bytes

from app.auth.keyring import KeyRing
from app.auth.keys import sqs_secret, sqs_selector
from app.auth.policy import Principal
from app.errors import AppError, KeyLookupsThrottled
from app.settings import Settings

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
TERMINATOR = "aws4_request"
MAX_SKEW_SECONDS = 300  # a request dated further from the server's clock is refused (RequestExpired)
MAX_EXPIRES_SECONDS = 604_800  # the longest X-Amz-Expires AWS allows: a week
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_TIMESTAMP = "%Y%m%dT%H%M%SZ"
_HEX = frozenset("0123456789abcdef")
_BASIC = re.compile(r"[0-9]{8}T[0-9]{6}Z", re.ASCII)
_EXPIRES = re.compile(r"[0-9]{1,7}", re.ASCII)
_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check your AWS Secret Access "
    "Key and signing method (the pair `jobq keys create --sqs` printed, for this jobq's JOBQ_SQS_SERVER_SECRET)."
)
_UNKNOWN_KEY = "The security token included in the request is invalid: no live jobq key has this access key id."
NO_SERVER_SECRET = (
    "This jobq cannot verify SQS signatures: its operator has not set JOBQ_SQS_SERVER_SECRET (docs/security.md, "
    "SQS requests)."
)


class SqsAuthError(Exception):
    """An SQS request refused before any action ran. `code` is SQS's error code; the SQS endpoint renders it in
    the request's protocol (JSON or XML), with `status`."""

    def __init__(self, code: str, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def _incomplete(message: str) -> SqsAuthError:
    return SqsAuthError("IncompleteSignature", message, 400)


@dataclass(frozen=True, slots=True)
class Signature:
    """What a request says about its signature, read before any key is looked up."""

    access_key_id: str
    scope_date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    timestamp: str  # the request's date, ISO 8601 basic (YYYYMMDDTHHMMSSZ)
    signed_headers: tuple[str, ...]
    signature: str
    expires: int | None  # presigned (query) form: seconds the URL is valid from `timestamp`; header form: None

    @property
    def credential_scope(self) -> str:
        return f"{self.scope_date}/{self.region}/{self.service}/{TERMINATOR}"


# -- reading the request ----------------------------------------------------------------------------------


def header_map(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, list[str]]:
    """ASGI headers by lower-case name, repeated ones in order. Values keep their bytes through
    surrogateescape, so the canonical request is the bytes the client signed."""
    out: dict[str, list[str]] = {}
    for name, value in headers:
        out.setdefault(name.decode("latin-1").lower(), []).append(value.decode("utf-8", "surrogateescape"))
    return out


def query_pairs(query_string: str) -> list[tuple[bytes, bytes]]:
    """The query's (name, value) pairs, percent-decoded to bytes (`+` is not a space: AWS encodes it)."""
    pairs = []
    for part in query_string.split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((unquote_to_bytes(name), unquote_to_bytes(value)))
    return pairs


def parse_signature(headers: Mapping[str, list[str]], pairs: list[tuple[bytes, bytes]]) -> Signature | None:
    """The request's signature fields (None: it has none); IncompleteSignature when they are malformed."""
    query = {name.decode("utf-8", "replace"): value.decode("utf-8", "replace") for name, value in pairs}
    authorization = headers.get("authorization")
    if authorization:
        if "X-Amz-Algorithm" in query:
            raise _incomplete("Sign in the Authorization header or in the query string, not both.")
        return _from_header(authorization, headers)
    if "X-Amz-Algorithm" in query or "X-Amz-Credential" in query:
        return _from_query(query)
    return None


def _from_header(values: list[str], headers: Mapping[str, list[str]]) -> Signature:
    if len(values) > 1:
        raise _incomplete("Send one Authorization header.")
    algorithm, _, rest = values[0].strip().partition(" ")
    if algorithm != ALGORITHM:
        raise _incomplete(f"Only AWS Signature Version 4 ({ALGORITHM}) is accepted.")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or name in fields:
            raise _incomplete("The Authorization header must be `AWS4-HMAC-SHA256 Credential=..., "
                              "SignedHeaders=..., Signature=...`.")  # fmt: skip
        fields[name] = value.strip()
    missing = [f for f in ("Credential", "SignedHeaders", "Signature") if not fields.get(f)]
    if missing:
        raise _incomplete(f"The Authorization header lacks {', '.join(missing)}.")
    return _signature(fields["Credential"], fields["SignedHeaders"], fields["Signature"], _header_date(headers), None)


def _from_query(query: Mapping[str, str]) -> Signature:
    missing = [
        f"X-Amz-{f}"
        for f in ("Algorithm", "Credential", "Date", "Expires", "SignedHeaders", "Signature")
        if not query.get(f"X-Amz-{f}")
    ]
    if missing:
        raise _incomplete(f"The presigned query lacks {', '.join(missing)}.")
    if query["X-Amz-Algorithm"] != ALGORITHM:
        raise _incomplete(f"Only AWS Signature Version 4 ({ALGORITHM}) is accepted.")
    expires = query["X-Amz-Expires"]
    if not _EXPIRES.fullmatch(expires) or not 1 <= int(expires) <= MAX_EXPIRES_SECONDS:
        raise _incomplete(f"X-Amz-Expires must be 1 to {MAX_EXPIRES_SECONDS} seconds.")
    timestamp = _basic_timestamp(query["X-Amz-Date"])
    return _signature(
        query["X-Amz-Credential"], query["X-Amz-SignedHeaders"], query["X-Amz-Signature"], timestamp, int(expires)
    )


def _signature(credential: str, signed: str, signature: str, timestamp: str, expires: int | None) -> Signature:
    parts = credential.split("/")
    if len(parts) != 5 or not all(parts) or parts[4] != TERMINATOR:
        raise _incomplete(f"Credential must be <access key id>/<YYYYMMDD>/<region>/{SERVICE}/{TERMINATOR}.")
    names = tuple(signed.split(";"))  # sorted, by the specification; kept in the order the client gave
    if len(set(names)) != len(names) or not all(names) or any(n != n.lower() for n in names):
        raise _incomplete("SignedHeaders must be distinct lower-case header names separated by `;`.")
    if "host" not in names:
        raise _incomplete("The Host header must be signed (SignedHeaders lacks `host`).")
    if len(signature) != 64 or not set(signature) <= _HEX:
        raise _incomplete("Signature must be 64 lower-case hexadecimal digits.")
    return Signature(parts[0], parts[1], parts[2], parts[3], timestamp, names, signature, expires)


def _header_date(headers: Mapping[str, list[str]]) -> str:
    if amz := headers.get("x-amz-date"):
        return _basic_timestamp(amz[0])
    if date := headers.get("date"):
        try:
            parsed = parsedate_to_datetime(date[0])
            if parsed.tzinfo is None:  # `-0000` (botocore's formatdate): UTC, says RFC 5322
                parsed = parsed.replace(tzinfo=UTC)
            return _basic_timestamp(parsed.astimezone(UTC).strftime(_TIMESTAMP))
        except (TypeError, ValueError, IndexError, OverflowError):
            raise _incomplete("The Date header is not an HTTP date.") from None
    raise _incomplete("A signed request needs an X-Amz-Date or a Date header.")


def _basic_timestamp(value: str) -> str:
    try:
        if _BASIC.fullmatch(value):
            datetime.strptime(value, _TIMESTAMP).replace(tzinfo=UTC).timestamp()  # a real date and time
            return value
    except (ValueError, OverflowError):
        pass
    raise _incomplete("X-Amz-Date must be a date and time in ISO 8601 basic format (YYYYMMDDTHHMMSSZ).")


# -- the signature itself -----------------------------------------------------------------------------------


def check_time(sig: Signature, now: float) -> None:
    """RequestExpired unless the request's date is within MAX_SKEW_SECONDS of `now` (presigned: from
    MAX_SKEW_SECONDS before its date to X-Amz-Expires after)."""
    signed_at = datetime.strptime(sig.timestamp, _TIMESTAMP).replace(tzinfo=UTC).timestamp()
    if signed_at - now > MAX_SKEW_SECONDS:
        raise SqsAuthError("RequestExpired", f"Request dated {sig.timestamp}, more than 5 minutes ahead of now.", 400)
    if now - signed_at > (MAX_SKEW_SECONDS if sig.expires is None else sig.expires):
        how_long = "5 minutes" if sig.expires is None else f"X-Amz-Expires={sig.expires} seconds"
        message = f"Request has expired: dated {sig.timestamp}, more than {how_long} ago."
        raise SqsAuthError("RequestExpired", message, 400)


def canonical_uri(raw_path: str) -> str:
    """The path with dot segments and empty segments removed, URI-encoded once more (services but S3)."""
    segments: list[str] = []
    for segment in raw_path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment and segment != ".":
            segments.append(segment)
    path = "/" + "/".join(segments)
    if raw_path.endswith("/") and segments:
        path += "/"
    return quote(path, safe="/~")


def canonical_query(pairs: list[tuple[bytes, bytes]], presigned: bool) -> str:
    encoded = sorted(
        (quote_from_bytes(name, safe="-_.~"), quote_from_bytes(value, safe="-_.~"))
        for name, value in pairs
        if not (presigned and name == b"X-Amz-Signature")
    )
    return "&".join(f"{name}={value}" for name, value in encoded)


def payload_hash(headers: Mapping[str, list[str]], body: bytes) -> str:
    body_hash = hashlib.sha256(body).hexdigest()
    declared = headers.get("x-amz-content-sha256")
    if not declared:
        return body_hash
    value = declared[0].strip()
    if value == UNSIGNED_PAYLOAD:
        return value
    if len(value) != 64 or not set(value.lower()) <= _HEX:
        raise _incomplete(f"x-amz-content-sha256 must be the body's SHA-256 in hexadecimal or {UNSIGNED_PAYLOAD}.")
    if not hmac.compare_digest(value.lower(), body_hash):
        raise SqsAuthError("SignatureDoesNotMatch", "The body's SHA-256 is not the x-amz-content-sha256 sent.")
    return value


def canonical_request(
    method: str, raw_path: str, pairs: list[tuple[bytes, bytes]], headers: Mapping[str, list[str]], body: bytes,
    sig: Signature,
) -> str:  # fmt: skip
    lines = [method.upper(), canonical_uri(raw_path), canonical_query(pairs, sig.expires is not None)]
    for name in sig.signed_headers:
        # Trimmed, inner runs of spaces made one; a repeated header's values joined by commas, in order.
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in headers.get(name, []))}")
    lines += ["", ";".join(sig.signed_headers), payload_hash(headers, body)]
    return "\n".join(lines)


def string_to_sign(sig: Signature, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{ALGORITHM}\n{sig.timestamp}\n{sig.credential_scope}\n{digest}"


def signing_key(secret: str, sig: Signature) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (sig.scope_date, sig.region, sig.service, TERMINATOR):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def expected_signature(secret: str, sig: Signature, canonical: str) -> str:
    return hmac.new(signing_key(secret, sig), string_to_sign(sig, canonical).encode(), hashlib.sha256).hexdigest()


# -- the entry point ------------------------------------------------------------------------------------------


async def authenticate_sqs(
    method: str,
    raw_path: str,
    query_string: str,
    headers: Iterable[tuple[bytes, bytes]],
    body: bytes,
    keyring: KeyRing,
    settings: Settings,
    *,
    now: float | None = None,
) -> Principal:
    """The jobq key that signed this SQS request, whose scopes and queue patterns then apply to its action;
    SqsAuthError otherwise. `raw_path` and `query_string` are as sent (percent-encoded): ASGI's `raw_path`
    and `query_string`."""
    by_name = header_map(headers)
    if any(v.strip()[:7].lower() == "bearer " for v in by_name.get("authorization", [])):
        # A jobq key the Authenticate layer found no live key for (a valid one never gets here).
        raise SqsAuthError("InvalidClientTokenId", "The jobq key is not valid: unknown, revoked or malformed.")
    pairs = query_pairs(query_string)
    sig = parse_signature(by_name, pairs)
    if sig is None:
        raise SqsAuthError(
            "MissingAuthenticationToken",
            "This jobq requires keys: sign the request with AWS Signature Version 4, with the pair of a jobq key "
            "(`jobq keys create --sqs`).",
        )
    if sig.service != SERVICE:
        raise SqsAuthError("SignatureDoesNotMatch", f"Credential should be scoped to the service {SERVICE!r}.")
    if sig.scope_date != sig.timestamp[:8]:
        raise SqsAuthError("SignatureDoesNotMatch", "The credential scope's date is not the request's date.")
    check_time(sig, time.time() if now is None else now)
    server_secret = settings.sqs_server_secret
    if server_secret is None:
        raise SqsAuthError("InvalidClientTokenId", NO_SERVER_SECRET)
    selector = sqs_selector(sig.access_key_id)
    if selector is None:
        raise SqsAuthError("InvalidClientTokenId", _UNKNOWN_KEY)
    try:
        principal = await keyring.live_principal(selector)
    except KeyLookupsThrottled:
        message = "Too many requests with unknown access key ids; retry later."
        raise SqsAuthError("RequestThrottled", message, 400) from None
    except AppError as exc:  # the database is unreachable: the key cannot be checked now
        raise SqsAuthError("ServiceUnavailable", exc.detail or "The key cannot be checked now; retry.", 503) from exc
    if principal is None or principal.key_id is None:
        raise SqsAuthError("InvalidClientTokenId", _UNKNOWN_KEY)
    secret = sqs_secret(server_secret.get_secret_value(), selector, principal.key_id)
    expected = expected_signature(secret, sig, canonical_request(method, raw_path, pairs, by_name, body, sig))
    if not hmac.compare_digest(expected, sig.signature):
        raise SqsAuthError("SignatureDoesNotMatch", _MISMATCH)
    keyring.used(principal)
    return principal


class SignedParts(Protocol):
    """An SQS request as its endpoint read it: method, path (decoded), query, ASGI headers, the whole body."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def query_string(self) -> bytes: ...
    @property
    def headers(self) -> list[tuple[bytes, bytes]]: ...
    @property
    def body(self) -> bytes: ...


def sqs_authenticator(
    keyring: Callable[[], KeyRing], settings: Settings
) -> Callable[[SignedParts], Awaitable[Principal]]:
    """authenticate_sqs() for the SQS endpoint, which has the request's parts and no key ring of its own (the
    ring exists once the lifespan has started: `keyring` finds it)."""

    async def authenticate(parts: SignedParts) -> Principal:
        # The path as the SDKs encode it (their serialisers leave `/` and `~` alone): the SQS endpoint's paths
        # (`/`, `/<account>/<queue>`) hold nothing that decoding could have changed.
        raw_path = quote(parts.path, safe="/~")
        query = parts.query_string.decode("latin-1")
        return await authenticate_sqs(parts.method, raw_path, query, parts.headers, parts.body, keyring(), settings)

    return authenticate


def signer_recheck(keyring: KeyRing, parts: SignedParts, principal: Principal) -> Callable[[], Awaitable[bool]]:
    """For a request verified by sqs_authenticator(): whether the key that signed it is still live, asked again
    before a long-poll that waited hands out messages (the Recheck of app/auth/middleware.py)."""
    sig = parse_signature(header_map(parts.headers), query_pairs(parts.query_string.decode("latin-1")))
    selector = sqs_selector(sig.access_key_id) if sig is not None else None

    async def still_valid() -> bool:
        # From the cache while nothing changed; after a revocation's NOTIFY emptied it, from the database.
        return selector is not None and await keyring.live_principal(selector) == principal

    return still_valid
