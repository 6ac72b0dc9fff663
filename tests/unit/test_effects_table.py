"""The effects table (app/core/effects.py) is the whole state machine: its states are the schema's statuses,
its rows exactly the transitions the write paths make, and apply() refuses a move its row does not list."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path as FilePath
from typing import Any

import pytest

from app.core.effects import (
    CANCELLED,
    COMPLETED,
    FAILED,
    GONE,
    NEW,
    PENDING,
    RUNNING,
    SCHEDULED,
    TABLE,
    WAITING,
    Effects,
    Moves,
    Path,
    UnlistedMove,
)
from app.core.jobs import inserted_moves
from app.db.jobs import NewJob
from app.db.rows import Inserted, JobRow
from app.observability.metrics import EVENTS, Metrics

MIGRATIONS = FilePath(__file__).resolve().parents[2] / "migrations"

# The state machine, written out once more by hand: a transition added to the schema's writes without a row
# (or a row without a write) shows up here.
MACHINE = {
    (NEW, PENDING),  # enqueue, a schedule's tick, a dependant whose parents are done
    (NEW, SCHEDULED),  # enqueue for later
    (NEW, WAITING),  # enqueue with unfinished dependencies
    (NEW, CANCELLED),  # enqueue with a failed dependency
    (NEW, RUNNING),  # enqueue handed to a claim parked in the process, in the same transaction
    (PENDING, RUNNING),  # claim
    (RUNNING, COMPLETED),  # complete
    (RUNNING, FAILED),  # fail for good, a lapsed lease or a hard timeout on the last attempt
    (RUNNING, PENDING),  # retry now, release now, lapsed lease, the dispatcher's hand-back
    (RUNNING, SCHEDULED),  # retry later, release later, a hard timeout (retried after a backoff)
    (PENDING, CANCELLED),
    (WAITING, CANCELLED),  # cancel, or a dependency failed (the release)
    (RUNNING, CANCELLED),
    (WAITING, PENDING),  # the last dependency finished (the release)
    (FAILED, PENDING),  # retry, redrive
    (CANCELLED, PENDING),  # retry
    (COMPLETED, PENDING),  # retry: a replay
    (COMPLETED, GONE),  # retention
    (FAILED, GONE),
    (CANCELLED, GONE),
}


# The jobs.status column's CHECK as created (0001), and each later replacement of jobs_status_check.
STATUS_CHECK = re.compile(r"(?:DEFAULT 'pending'|jobs_status_check)\s+CHECK \(status IN \(([^)]*)\)\)")


def schema_statuses() -> set[str]:
    """The statuses the latest migration allows."""
    found: list[str] = []
    for f in sorted(MIGRATIONS.glob("*.sql")):
        for m in STATUS_CHECK.finditer(f.read_text()):
            found = [s.strip().strip("'") for s in m.group(1).split(",")]
    return set(found)


def test_the_states_are_the_schemas_statuses() -> None:
    assert schema_statuses() == {PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, WAITING}
    states = {s for key in TABLE for s in key}
    assert states == schema_statuses() | {NEW, GONE, SCHEDULED}
    # No write makes a job due (time does): SCHEDULED is only arrived at; NEW only left, GONE only reached.
    assert all(frm not in (SCHEDULED, GONE) and to != NEW for frm, to in TABLE)


def test_the_table_has_a_row_for_every_transition_and_no_other() -> None:
    assert set(TABLE) == MACHINE


def test_every_path_makes_some_move_and_counts_only_known_events() -> None:
    assert {p for e in TABLE.values() for p in e.paths} == set(Path)
    extra = {"swept_rescued", "swept_failed", "swept_deleted", "swept_timed_out", "ticks_enqueued"}
    for e in TABLE.values():
        for events in e.paths.values():
            assert set(events) <= set(EVENTS) | extra
    # A final status wakes its result waiters; a freed slot or new work wakes claims.
    for (frm, to), e in TABLE.items():
        assert e.results == (to in (COMPLETED, FAILED, CANCELLED)), (frm, to)


class Seam:
    """The wake-up seam's outgoing calls, recorded (no database: apply() only calls them)."""

    def __init__(self) -> None:
        self.available: list[set[str]] = []
        self.finished: list[list[int]] = []

    def jobs_available(self, queues: Iterable[str]) -> None:
        self.available.append(set(queues))

    def jobs_finished(self, ids: list[int]) -> None:
        self.finished.append(list(ids))


class Configs:
    def __init__(self, limited: set[str]) -> None:
        self.limited = limited

    def may_be_limited(self, queue: str) -> bool:
        return queue in self.limited


def effects(seam: Seam, limited: set[str]) -> tuple[Effects, Metrics]:
    metrics = Metrics()
    fx: Any = Effects(seam, metrics, Configs(limited))  # type: ignore[arg-type]
    return fx, metrics


def test_apply_sums_a_statement_and_wakes_once() -> None:
    seam = Seam()
    fx, metrics = effects(seam, {"lim"})
    moves = Moves(Path.COMPLETE)
    moves.completed("lim", [1, 2], [12.0, 30.0])
    moves.completed("plain", [3], [5.0])
    fx.apply(moves)
    assert seam.finished == [[1, 2, 3]]
    assert seam.available == [{"lim"}]  # "plain" has no limits: a freed slot there frees nothing
    assert metrics.registry.get_sample_value("jobq_jobs_completed_total", {"queue": "lim"}) == 2
    assert metrics.registry.get_sample_value("jobq_job_duration_seconds_count", {"queue": "plain"}) == 1


def test_apply_refuses_a_move_its_row_does_not_list() -> None:
    fx, _ = effects(Seam(), set())
    wrong = Moves(Path.CLAIM)
    wrong.add_jobs("q", RUNNING, COMPLETED, [1])
    with pytest.raises(UnlistedMove):
        fx.apply(wrong)
    impossible = Moves(Path.RETRY)
    impossible.add("q", RUNNING, PENDING)
    with pytest.raises(UnlistedMove):
        fx.apply(impossible)
    backwards = Moves(Path.DEPENDENCY)  # the release only ever moves waiting jobs on
    backwards.add("q", PENDING, WAITING)
    with pytest.raises(UnlistedMove):
        fx.apply(backwards)


def job(queue: str, job_id: int, later: bool = False) -> Inserted:
    now = datetime.now(UTC)
    fields: dict[str, Any] = dict.fromkeys(JobRow._fields)
    fields.update(id=job_id, queue=queue, status=PENDING, created_at=now, run_at=now + timedelta(seconds=later))
    return Inserted(True, JobRow(**fields))


def test_an_insert_reports_each_job_made_due_or_not() -> None:
    asked = [NewJob("a", "1", 0, None, None, 5, None), NewJob("b", "1", 0, None, 60.0, 5, None)]
    rows = [job("a", 1), job("b", 2, later=True), Inserted(False, job("a", 0).job)]  # the last: a key's job
    assert inserted_moves(asked[:1] * 2, [rows[0], rows[2]]).counts == {("a", NEW, PENDING): 1}
    assert inserted_moves(asked, rows[:2]).counts == {("a", NEW, PENDING): 1, ("b", NEW, SCHEDULED): 1}
