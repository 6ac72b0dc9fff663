"""`jobq job ID`'s human form (app/runtime/cli/jobs.py job_lines): pure formatting, no server."""

from __future__ import annotations

from typing import Any

from app.runtime.cli.jobs import job_lines

AT = "2026-11-30T12:00:00+00:00"


def job(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 42, "queue": "uploads", "status": "running", "payload": {"file": "a.bin"}, "priority": 0,
        "attempts": 1, "max_attempts": 5, "run_at": AT, "created_at": AT, "claimed_at": AT,
        "lease_expires_at": AT, "finished_at": None, "worker": "w-1", "last_error": None, "result": None,
        "idempotency_key": None, "traceparent": None, "schedule": None, "scheduled_for": None, "group": None,
        "progress": None,
    }  # fmt: skip
    return base | changes


def test_progress_and_group_are_shown_when_the_job_has_them() -> None:
    lines = job_lines(job(progress={"done": 40, "total": 100}, group="customer-7"))
    text = "\n".join(lines)
    assert "  group           customer-7" in lines
    assert '  progress\n    {\n      "done": 40,\n      "total": 100\n    }' in text
    assert text.index("progress") < text.index("payload")


def test_no_progress_no_progress_section() -> None:
    lines = job_lines(job())
    assert not any(line.strip() in ("progress", "group") or line.startswith("  group") for line in lines)
    assert "  payload" in lines and "  result" in lines
