"""The committed sql/*.sql files are every statement of app/db as it runs: they must be what it renders."""

from __future__ import annotations

from pathlib import Path

from app.db import claim, jobs, render, writes

COMMITTED = Path(__file__).parent.parent.parent / "sql"


def test_committed_sql_matches_the_statements() -> None:
    rendered = render.render()
    committed = {path.name: path.read_text() for path in COMMITTED.glob("*.sql")}
    assert committed.keys() == rendered.keys(), "run `make sql` and commit sql/"
    for name, text in rendered.items():
        assert committed[name] == text, f"sql/{name} is out of date: run `make sql` and commit sql/"


def test_statements_are_rendered_whole_and_fragments_left_out() -> None:
    found = render.statements(jobs)
    # Composed at import from JOB_COLUMNS: the file holds the columns, not the name of the fragment.
    assert (
        "JOB_GET" in found and "{JOB_COLUMNS}" not in found["JOB_GET"] and "j.queue_name AS queue" in found["JOB_GET"]
    )
    assert render.statements(writes)["JOB_COMPLETE_MANY"] == writes.JOB_COMPLETE_MANY
    assert "JOB_COLUMNS" not in found and "RUNNING" not in found  # fragments, not statements
    assert f"-- name: JOB_CLAIM --\n{claim.JOB_CLAIM.strip()}\n" in render.render()["claim.sql"]
