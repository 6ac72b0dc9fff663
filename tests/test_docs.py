"""The README tells the truth: its configuration table is the settings, CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import markdown_table

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_settings_table_is_current() -> None:
    match = re.search(r"<!-- settings-table -->\n(.*?)\n<!-- /settings-table -->", README, re.S)
    assert match, "README lost its settings-table markers"
    assert match.group(1) == markdown_table(), "run `python -m app.settings` and paste the table into README.md"


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_makefile_has_the_readme_targets() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test", "lint", "openapi", "bench"):
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_tests_the_readme_names_exist() -> None:
    named = set(re.findall(r"`(test_\w+)`", README))
    defined = {
        name
        for path in (ROOT / "tests").glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)", path.read_text(), re.M)
    }
    assert named, "the README cites the tests behind its guarantees"
    assert named <= defined, named - defined
