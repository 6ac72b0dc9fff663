"""An AppError as an HTTP answer (problem+json), for every layer that answers: the routes, and the ASGI
layers that refuse a request before any route sees it (app/auth/middleware.py, app/http/fastpath.py,
app/runtime/connections.py). Beside app/errors.py, which stays free of HTTP types, so that the layers
below http can raise errors without importing starlette."""

from __future__ import annotations

from starlette.responses import Response

from app.errors import PROBLEM_MEDIA_TYPE, AppError


def problem_response(exc: AppError, instance: str | None = None) -> Response:
    return Response(exc.render(instance), status_code=exc.status, media_type=PROBLEM_MEDIA_TYPE, headers=exc.headers())
