"""The docs tell the truth: the settings table is the settings, CI runs the README's test command, and
every test the docs cite exists."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def docs() -> list[Path]:
    """The pages a reader is sent to: the README and docs/*.md."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_settings_table_is_current() -> None:
    text = CONFIGURATION.read_text()
    match = re.search(r"<!-- settings-table -->\n(.*?)\n<!-- /settings-table -->", text, re.S)
    assert match, "docs/configuration.md lost its settings-table markers"
    assert match.group(1) == markdown_table(), "run `python -m app.settings --write` to update docs/configuration.md"


def test_ci_runs_the_readme_test_command() -> None:
    readme = README.read_text()
    assert "make run" in readme
    assert "make test" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M)


def test_makefile_has_the_readme_targets() -> None:
    makefile = (ROOT / "Makefile").read_text()
    readme = README.read_text()
    for target in ("run", "test", "lint", "openapi", "bench"):
        assert re.search(rf"^{target}:", makefile, re.M), target
        assert f"make {target}" in readme, target


def test_tests_the_docs_name_exist() -> None:
    defined = {
        name
        for path in (ROOT / "tests").rglob("test_*.py")
        for name in re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M)
    }
    assert set(re.findall(r"`(test_\w+)`", README.read_text())), "the README cites the tests behind its guarantees"
    missing = [
        f"{page.relative_to(ROOT)}: {name}"
        for page in docs()
        for name in sorted(set(re.findall(r"`(test_\w+)`", page.read_text())))
        if name not in defined
    ]
    assert not missing, "\n".join(missing)
