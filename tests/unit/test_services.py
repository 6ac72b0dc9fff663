"""The composition root's accessor: before the lifespan has built the parts, a clear error, not an AttributeError."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from app.main import create_app
from app.services import services
from app.settings import Settings


def test_services_before_the_lifespan_say_so() -> None:
    app = create_app(Settings.defaults(database_url="postgresql://unused"))
    with pytest.raises(RuntimeError, match="lifespan has not started"):
        app.services  # noqa: B018
    request = Request({"type": "http", "app": app.api, "headers": []})
    with pytest.raises(RuntimeError, match="lifespan has not started"):
        services(request)
