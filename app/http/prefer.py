"""`Prefer: return=minimal` (RFC 7240): the producer and worker writes that can answer ids and states
instead of the whole job, for a client that does not read the document."""

from __future__ import annotations

from starlette.requests import Request

# Sent with a minimal answer (RFC 7240 section 3); a full answer, the default, carries no such field.
APPLIED = (b"preference-applied", b"return=minimal")


def prefers_minimal(request: Request) -> bool:
    """Whether the request's first `return` preference is `minimal`. RFC 7240: the first instance of a
    preference counts (over every Prefer field, in order); preferences the server does not know, or values
    it cannot read, are ignored, never an error. Reads the raw header list, not request.headers (which
    builds an object): a request without Prefer pays one pass over its few header names."""
    for name, value in request.scope["headers"]:
        if name == b"prefer":
            for preference in value.split(b","):
                token, equals, word = preference.split(b";", 1)[0].partition(b"=")
                if token.strip().lower() == b"return":
                    return bool(equals) and word.strip().strip(b'"').lower() == b"minimal"
    return False
