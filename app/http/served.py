"""The `JOBQ-Served-By` header of answers whose reads may come from the read replica (app/db/replica.py):
`replica` or `primary`, so that a client or an operator can tell a lagging answer from a current one."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from app.db.replica import SERVED_BY_HEADER, Served, recording_served

__all__ = ["SERVED_BY_RESPONSES", "recording_served", "served_by"]

# For the routes' `responses=`: the header, documented on their 200 answer.
SERVED_BY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            SERVED_BY_HEADER: {
                "description": "Which server the answer was read from: `replica` (JOBQ_READ_DATABASE_URL, at most "
                "JOBQ_READ_MAX_LAG_SECONDS behind the primary) or `primary` (no replica configured, or it was "
                "down or too far behind).",
                "schema": {"type": "string", "enum": ["primary", "replica"]},
            }
        }
    }
}


def served_by(response: Response, served: Served) -> Response:
    response.raw_headers.append((SERVED_BY_HEADER.lower().encode(), (served.by or "primary").encode()))
    return response
