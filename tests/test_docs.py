"""The docs tell the truth: the settings table is the settings, CI runs the README's test command, and
every test, file and anchor the docs cite exists. Nor does any comment or doc anywhere in the repository
cite a file that is not in it."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from app.settings import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"


# Paths that look like the repository's but name something else, with why.
NOT_REPOSITORY_PATHS = {
    "app/migrations": "where the wheel puts migrations/ (pyproject.toml force-includes it there)",
}

# Text files whose comments and docs are ours (tests/compose-spec/ is vendored).
TEXT_SUFFIXES = {".py", ".md", ".sql", ".toml", ".yaml", ".yml", ".sh", ".mjs", ".js", ".html", ".css"}
TEXT_NAMES = {"Dockerfile", "Makefile"}
VENDORED = ("tests/compose-spec/",)

# A path into the repository: one of its top-level folders, not inside a longer path or a URL.
REPO_PATH = re.compile(r"(?<![\w./-])((?:app|tests|docs|bench|migrations|clients|examples|openapi)/[\w./*-]*[\w*/])")
# The design brief and its reference article live outside the repository (beside it, in ../shared/):
# text may describe them, but never name them as if a reader could open them here.
OUTSIDE = re.compile(r"(?<![\w-])(DESIGN\.md|postgres-skip-locked-queue\.txt)")

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def docs() -> list[Path]:
    """The pages a reader is sent to: the README and docs/*.md."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


@cache
def repository_files() -> frozenset[str]:
    """Tracked files, and new ones git does not ignore (so a page can be checked before `git add`)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the repository's files are unknown")
    return frozenset(path for path in listed.splitlines() if (ROOT / path).is_file())


@cache
def repository_dirs() -> frozenset[str]:
    return frozenset(str(parent) for path in repository_files() for parent in Path(path).parents if parent.parts)


def in_repository(path: str) -> bool:
    path = path.rstrip("/")
    if "*" in path:
        return any(fnmatch.fnmatch(known, path) for known in repository_files() | repository_dirs())
    return path in repository_files() or path in repository_dirs()


def ignored(paths: set[str]) -> set[str]:
    """The paths git ignores: outputs a command writes (bench/results/...), never part of the repository."""
    if not paths:
        return set()
    answer = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(sorted(paths)),
        capture_output=True,
        text=True,
    )
    return set(answer.stdout.splitlines())


def prose(text: str) -> str:
    """Markdown without code blocks and code spans, blanked out so that line numbers stay."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return CODE_SPAN.sub(blank, FENCE.sub(blank, text))


@cache
def anchors(page: Path) -> frozenset[str]:
    """The fragments GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(found)


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


def test_relative_links_reach_a_file_and_heading() -> None:
    pages = [
        ROOT / path for path in sorted(repository_files()) if path.endswith(".md") and not path.startswith(VENDORED)
    ]
    assert set(docs()) <= set(pages)
    broken = []
    for page in pages:
        for number, line in enumerate(prose(page.read_text()).splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                where = f"{page.relative_to(ROOT)}:{number}: {target}"
                path, _, fragment = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.is_relative_to(ROOT):
                    broken.append(f"{where} (outside the repository)")
                    continue
                relative = dest.relative_to(ROOT).as_posix()
                if not in_repository(relative):
                    broken.append(f"{where} (no such file)")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_no_comment_or_doc_cites_a_file_that_is_not_in_the_repository() -> None:
    texts = []
    for path in sorted(repository_files()):
        if path.startswith(VENDORED):
            continue
        text = (ROOT / path).read_text(errors="replace")
        if Path(path).suffix in TEXT_SUFFIXES or Path(path).name in TEXT_NAMES or text.startswith("#!"):
            texts.append((path, text))
    cited: list[tuple[str, int, str]] = []
    dangling = []
    for path, text in texts:
        for number, line in enumerate(text.splitlines(), 1):
            cited += [(path, number, match) for match in REPO_PATH.findall(line)]
            dangling += [f"{path}:{number}: {name} (outside the repository)" for name in OUTSIDE.findall(line)]
    unknown = {name for _, _, name in cited if not in_repository(name)}
    generated = ignored(unknown)
    dangling += [
        f"{path}:{number}: {name}"
        for path, number, name in cited
        if name in unknown - generated and name.rstrip("/") not in NOT_REPOSITORY_PATHS
    ]
    assert cited, "the scan found no citation at all: is REPO_PATH still right?"
    assert not dangling, "cited but not in the repository:\n" + "\n".join(dangling)
