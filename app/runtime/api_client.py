"""A small blocking client of jobq's HTTP API, for the `jobq` command's daily-work commands (app/runtime/cli/).

Standard library only (urllib), on purpose: the `jobq` that runs the service, in its container image too,
can talk to a jobq without installing anything more. The Python SDK (clients/python) is the client for
applications: connection pools, async, retries, the Worker. A command makes one request at a time and
reports every failure to the person who typed it, so it needs none of that; and the server's package does
not depend on the SDK's (a separate distribution, released on its own).

Errors, drawn as app/errors.py draws the server's:

  ApiError
   +-- Problem        the server answered 4xx/5xx; its problem+json document, when it sent one
   +-- Unreachable    no answer: connection refused, DNS, TLS, timeout
   +-- NotJobq        a 2xx that is not JSON (a proxy's page, another service on that port)
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROBLEM_TYPE_PREFIX = "urn:jobq:problem:"
DEFAULT_TIMEOUT = 10.0
USER_AGENT = "jobq-cli/0.1.0"
_NO_BODY = object()


class ApiError(Exception):
    """The request did not succeed."""


@dataclass
class Problem(ApiError):
    """A 4xx or 5xx answer. `type` is the stable URN of a jobq problem (`urn:jobq:problem:<slug>`); an
    answer that was not problem+json (a proxy's 502 page) gets `about:blank` and its status line."""

    status: int
    type: str = "about:blank"
    title: str = ""
    detail: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)
    retry_after: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.detail or self.title)

    @property
    def slug(self) -> str:
        """`job-not-found`, `invalid-state`, ...; for an answer that is not jobq's, its title."""
        if self.type.startswith(PROBLEM_TYPE_PREFIX):
            return self.type.removeprefix(PROBLEM_TYPE_PREFIX)
        return self.title or "error"

    @classmethod
    def from_answer(cls, status: int, reason: str, content_type: str, body: bytes, retry_after: str | None) -> Problem:
        doc: Any = None
        if "json" in content_type:
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
        if not isinstance(doc, dict):
            text = " ".join(body.decode("utf-8", "replace").split())[:200]
            return cls(status, title=reason, detail=text, retry_after=retry_after)
        errors = doc.get("errors")
        return cls(
            status,
            type=str(doc.get("type") or "about:blank"),
            title=str(doc.get("title") or reason),
            detail=str(doc.get("detail") or ""),
            errors=[e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else [],
            retry_after=retry_after,
        )


class Unreachable(ApiError):
    """No answer came: the connection failed or timed out."""


class NotJobq(ApiError):
    """A success answer that is not a JSON document."""


def segment(value: str | int) -> str:
    """A path segment, percent-encoded (a queue name may hold `:`, which is kept, and nothing that needs
    more, but a typo should reach the server as a 422, not as another path)."""
    return urllib.parse.quote(str(value), safe=":")


class ApiClient:
    """One jobq at `url`; `api_key` is sent as `Authorization: Bearer`. Every call returns the answer's
    JSON document (None for an empty one) or raises an ApiError."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._headers = {"accept": "application/json, application/problem+json", "user-agent": USER_AGENT}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = _NO_BODY) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any = _NO_BODY) -> Any:
        return self.request("PUT", path, body)

    def patch(self, path: str, body: Any = _NO_BODY) -> Any:
        return self.request("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(self, method: str, path: str, body: Any = _NO_BODY, query: Mapping[str, Any] | None = None) -> Any:
        """`path` is the API path (segments already encoded, see segment()); `query` leaves out None values."""
        return self.answer(method, path, body, query)[1]

    def answer(
        self, method: str, path: str, body: Any = _NO_BODY, query: Mapping[str, Any] | None = None
    ) -> tuple[int, Any]:
        """As request(), with the status of the success (201 created or 200 found, say)."""
        url = self.url + path
        if query:
            params = {k: str(v) for k, v in query.items() if v is not None}
            if params:
                url += "?" + urllib.parse.urlencode(params)
        headers = dict(self._headers)
        data = None
        if body is not _NO_BODY:
            data = json.dumps(body, allow_nan=False, ensure_ascii=False).encode()
            headers["content-type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                raw = exc.read()
                raise Problem.from_answer(
                    exc.code,
                    str(exc.reason or ""),
                    exc.headers.get("content-type", ""),
                    raw,
                    exc.headers.get("retry-after"),
                ) from None
        except (OSError, http.client.HTTPException) as exc:  # URLError, refused, reset, timeout; not HTTP at all
            reason = getattr(exc, "reason", None) or exc
            raise Unreachable(f"{self.url}: {str(reason) or type(exc).__name__}") from None
        if not raw.strip():
            return status, None
        try:
            return status, json.loads(raw)
        except ValueError:
            text = " ".join(raw.decode("utf-8", "replace").split())[:120]
            raise NotJobq(f"{self.url} answered with something that is not JSON: {text!r}") from None
