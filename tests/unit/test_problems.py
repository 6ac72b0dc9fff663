"""Problem documents (app/errors.py): the mapping of errors to RFC 9457 bodies, and of pydantic errors to
422 or 400."""

from __future__ import annotations

import orjson

from app.errors import (
    BadRequest,
    ClaimLost,
    DatabaseUnavailable,
    MethodNotAllowed,
    TooManyWaiters,
    Unauthorized,
    ValidationFailed,
    validation_problem,
)


def test_a_problem_has_type_title_status_detail_and_instance() -> None:
    body = orjson.loads(ClaimLost().render("/jobs/1/complete"))
    assert body == {
        "type": "urn:jobq:problem:claim-lost",
        "title": "Claim lost",
        "status": 409,
        "detail": ClaimLost.__doc__,
        "instance": "/jobs/1/complete",
    }


def test_retry_after_and_challenges_travel_as_headers() -> None:
    assert TooManyWaiters().headers() == {"retry-after": "1"}
    assert DatabaseUnavailable().headers() == {"retry-after": "2"}
    assert Unauthorized().headers() == {"www-authenticate": 'Bearer realm="jobq"'}
    assert Unauthorized(invalid=True).headers() == {"www-authenticate": 'Bearer realm="jobq", error="invalid_token"'}
    assert MethodNotAllowed(["GET", "POST"]).headers() == {"allow": "GET, POST"}


def test_pydantic_errors_become_one_422_with_their_locations() -> None:
    err = validation_problem(
        [
            {"loc": ("body", "limit"), "msg": "Input should be less than or equal to 100", "type": "less_than_equal"},
            {"loc": ("body", "worker"), "msg": "Field required", "type": "missing", "input": {"secret": 1}},
        ]
    )
    assert isinstance(err, ValidationFailed)
    assert err.status == 422
    assert err.extra["errors"] == [
        {"loc": ["body", "limit"], "msg": "Input should be less than or equal to 100", "type": "less_than_equal"},
        {"loc": ["body", "worker"], "msg": "Field required", "type": "missing"},
    ]
    assert "secret" not in err.render().decode()  # the input is never echoed


def test_a_json_syntax_error_is_a_400() -> None:
    err = validation_problem([{"loc": ("body", 7), "msg": "EOF while parsing", "type": "json_invalid"}])
    assert isinstance(err, BadRequest)
    assert err.status == 400
