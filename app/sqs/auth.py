"""The seam where SQS requests are authenticated when keys are required: one function from the request to
the jobq key (Principal) it names.

With keys off (an open service on loopback) SQS requests run open like the rest of jobq. With keys on, a
request carrying a jobq key (`Authorization: Bearer <key>`) has its Principal from the Authenticate layer
already; any other request goes to an SqsAuthenticator, which verifies AWS Signature V4 and returns the
key its access key id names (the SigV4 verifier of issue 23 plugs in here). Until one does (`refuse_unsigned`),
a request without a jobq key is refused with SQS's own codes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.auth.policy import Principal
from app.sqs.errors import InvalidClientTokenId, MissingAuthenticationToken, Refused


@dataclass(frozen=True, slots=True)
class RequestParts:
    """What a signature covers: the request as it arrived, its body read whole."""

    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]  # as the ASGI scope holds them: lower-case names
    body: bytes


# Verifies a request and returns the key it names; raises an SqsError (InvalidClientTokenId,
# SignatureDoesNotMatch, RequestExpired, ...) otherwise.
SqsAuthenticator = Callable[[RequestParts], Awaitable[Principal]]
# For a request an SqsAuthenticator verified: asks again whether its key is still live (a long-poll, before it
# hands out messages), as the Authenticate layer's Recheck does for a Bearer key.
SignerRecheck = Callable[[RequestParts, Principal], Callable[[], Awaitable[bool]]]


def refusing_with_codes(
    authenticate: Callable[[RequestParts], Awaitable[Principal]], error: type[Exception]
) -> SqsAuthenticator:
    """An authenticator whose refusals are exceptions of type `error` carrying `code`, `message` and `status`
    (SQS's code, its text, the HTTP status), made to raise them as SQS errors the endpoint renders."""

    async def checked(parts: RequestParts) -> Principal:
        try:
            return await authenticate(parts)
        except error as exc:
            raise Refused(
                str(getattr(exc, "code", "InvalidClientTokenId")),
                str(getattr(exc, "message", exc)),
                int(getattr(exc, "status", 403)),
            ) from None

    return checked


async def refuse_unsigned(parts: RequestParts) -> Principal:
    """No signature verification in this build: only jobq keys (Bearer) are accepted."""
    signed = any(name == b"authorization" for name, _ in parts.headers) or b"X-Amz-Signature=" in parts.query_string
    if not signed:
        raise MissingAuthenticationToken("Request is missing Authentication Token.")
    raise InvalidClientTokenId("The security token included in the request is invalid.")
