"""JSON and problem+json responses, shared by the FastAPI routes and the lean dispatcher."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from app.errors import PROBLEM_MEDIA_TYPE, AppError


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def problem_response(exc: AppError, instance: str | None = None) -> Response:
    return Response(exc.render(instance), status_code=exc.status, media_type=PROBLEM_MEDIA_TYPE, headers=exc.headers())
