"""Where a search page ends and the next begins (app/core/search.py _page), and which index a search walks
(app/db/search.py plan): pure logic, no database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.core.cursors import decode_cursor
from app.core.search import _page
from app.db import search as store_search
from app.db.rows import JobRow
from app.db.search import Criteria, SearchRow

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def job(job_id: int, priority: int = 0) -> JobRow:
    blank = dict.fromkeys(JobRow._fields)
    return JobRow(**blank | {"id": job_id, "queue": "q", "status": "pending", "priority": priority, "attempts": 0,
                             "max_attempts": 5, "run_at": WHEN, "created_at": WHEN})  # fmt: skip


def rows(examined: int, last_key: list[Any] | None, *jobs: JobRow) -> list[SearchRow]:
    """A page's rows: `examined` jobs walked (of the caller's queues: the walk sees no other)."""
    return [SearchRow(examined, last_key, j) for j in jobs] or [SearchRow(examined, last_key, None)]


BY_ID = store_search.plan(Criteria())


def test_more_matches_than_the_page_continue_after_the_last_shown() -> None:
    found = _page(BY_ID, rows(40, [3], job(9), job(7), job(5)), limit=2, budget=100)
    assert [j.id for j in found.jobs] == [9, 7]
    assert found.next_cursor is not None and decode_cursor(found.next_cursor, None) == [7]
    assert (found.examined, found.partial) == (40, False)


def test_a_walk_stopped_at_its_budget_continues_after_the_last_examined() -> None:
    found = _page(BY_ID, rows(100, [51], job(90)), limit=10, budget=100)
    assert [j.id for j in found.jobs] == [90]
    assert found.partial is True
    assert found.next_cursor is not None and decode_cursor(found.next_cursor, None) == [51]


def test_a_walk_that_ran_out_of_jobs_is_the_last_page() -> None:
    for page in (rows(7, [1], job(4)), rows(0, None)):
        found = _page(BY_ID, page, limit=10, budget=100)
        assert (found.next_cursor, found.partial) == (None, False)


def test_a_listing_walk_carries_the_listing_cursor() -> None:
    how = store_search.plan(Criteria(queue="q", statuses=("pending",)))
    found = _page(how, rows(3, None, job(1, 5), job(2, 5), job(3, 0)), limit=2, budget=100)
    assert found.next_cursor is not None and decode_cursor(found.next_cursor, "pending") == [5, WHEN, 2]


def test_lookups_are_one_page() -> None:
    how = store_search.plan(Criteria(idempotency_key="k"))
    found = _page(how, rows(100, [1], job(3), job(2)), limit=1, budget=100)
    assert ([j.id for j in found.jobs], found.next_cursor) == ([3], None)


@pytest.mark.parametrize(
    ("criteria", "statement", "bitmap"),
    [
        (Criteria(id=1, queue="q"), store_search.SEARCH_BY_ID_IN_QUEUE, False),
        (Criteria(id=1), store_search.SEARCH_BY_ID, False),
        (Criteria(idempotency_key="k", queue="q"), store_search.SEARCH_BY_KEY, False),
        (Criteria(idempotency_key="k"), store_search.SEARCH_BY_KEY_ANY_QUEUE, False),
        (Criteria(payload="{}", statuses=("failed",)), store_search.SEARCH_BY_PAYLOAD, True),
        (Criteria(payload="{}", statuses=("failed", "cancelled")), store_search.SEARCH_BY_PAYLOAD, True),
        (Criteria(payload="{}", statuses=("pending",), queue="q"), store_search.SEARCH_LISTING["pending"], False),
        (Criteria(payload="{}"), store_search.SEARCH_BY_ID_DESC, False),  # no status: not only indexed ones
        (Criteria(queue="q", statuses=("pending", "running")), store_search.SEARCH_BY_ID_DESC_IN_QUEUE, False),
        (Criteria(payload="{}", statuses=("failed",), queue="q"), store_search.SEARCH_BY_PAYLOAD_IN_QUEUE, True),
    ],
)
def test_each_search_walks_the_index_that_serves_it(criteria: Criteria, statement: str, bitmap: bool) -> None:
    how = store_search.plan(criteria)
    assert (how.statement, how.bitmap) == (statement, bitmap)
