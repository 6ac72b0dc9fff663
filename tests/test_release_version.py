"""One version everywhere: the package, CHANGELOG.md's latest release, /healthz, OpenAPI and `jobq --version`."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

import app
from app.main import published_document
from app.runtime.cli import build_parser
from tests.support import LiveServer

ROOT = Path(__file__).parent.parent
# A released entry's heading, as Keep a Changelog writes it: "## [1.2.3] - 2026-12-01".
RELEASED = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", re.M)


def latest_release() -> str:
    found = RELEASED.search((ROOT / "CHANGELOG.md").read_text())
    assert found, "CHANGELOG.md has no released entry (## [X.Y.Z] - YYYY-MM-DD)"
    return found.group(1)


def test_the_package_version_is_the_changelogs_latest_release() -> None:
    assert app.__version__ == latest_release(), "bump app/__init__.py's __version__ with CHANGELOG.md's entry"
    # The wheel's version is read from there, not written a second time in pyproject.toml.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == "app/__init__.py"


def test_the_changelog_has_an_unreleased_section_above_the_releases() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = text.find("\n## [Unreleased]\n")
    assert unreleased != -1 and unreleased < RELEASED.search(text).start()  # type: ignore[union-attr]


def test_openapi_and_the_command_answer_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    committed = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    assert committed["info"]["version"] == published_document()["info"]["version"] == latest_release()
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"jobq {latest_release()}\n"


def test_a_running_service_answers_the_version(server: LiveServer) -> None:
    assert server.client.get("/healthz").json() == {"status": "ok", "version": latest_release()}
    assert server.client.get("/openapi.json").json()["info"]["version"] == latest_release()
