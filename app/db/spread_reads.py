"""A spread queue read as one queue: its keys' answers (app/db/spread.py) added up into the queue's own.

Each key is read by the statement that reads any queue, once per key (on Citus each stays on its key's shard), and
the answers are added up here: counts summed, the oldest job the oldest of any key, histograms bucket by bucket
(so percentiles over a spread queue are exact, as over one key), and pages of a listing merged in the listing's
own order. A queue that is not spread is read once and never comes here."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import cmp_to_key
from itertools import zip_longest
from typing import Any, TypeVar

from app.db.rows import GroupsRow, QueueRow, QueueStatsRow

T = TypeVar("T")


def _oldest(values: Iterable[float | None]) -> float | None:
    """The largest age among those known (None: no key has one)."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _earliest(values: Iterable[datetime | None]) -> datetime | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def add_histograms(histograms: Iterable[Sequence[int] | None]) -> list[int] | None:
    """Bucket-by-bucket sum of duration histograms (queue_stats.durations_ms); None when no key has one."""
    known = [h for h in histograms if h]
    if not known:
        return None
    return [sum(b) for b in zip_longest(*known, fillvalue=0)]


def add_queue_rows(queue: QueueRow, keys: Iterable[QueueRow]) -> QueueRow:
    """A spread queue's row of GET /queues: key 0's (`queue`, which names the queue and holds its pause) with the
    other keys' counts added."""
    rows = [queue, *keys]
    return queue._replace(
        ready=sum(r.ready for r in rows),
        scheduled=sum(r.scheduled for r in rows),
        running=sum(r.running for r in rows),
        completed=sum(r.completed for r in rows),
        failed=sum(r.failed for r in rows),
        cancelled=sum(r.cancelled for r in rows),
        oldest_ready_age=_oldest(r.oldest_ready_age for r in rows),
        waiting=sum(r.waiting for r in rows),
        estimated=any(r.estimated for r in rows),
        counted_at=_earliest(r.counted_at for r in rows if r.estimated),
    )


# QueueStatsRow's fields that add up across keys (counts now, and the window's event counts).
_SUMMED = tuple(
    f.name
    for f in dataclasses.fields(QueueStatsRow)
    if f.name
    not in ("oldest_ready_age", "w_duration_max_ms", "w_durations_ms", "paused", "as_of", "estimated", "counted_at")
)


def add_stats(rows: Sequence[QueueStatsRow]) -> QueueStatsRow:
    """A spread queue's stats from its keys' (key 0 first, read in one transaction, so one now()): counts and the
    window's events summed; the oldest ready job the oldest of any key; the longest duration the longest; the
    duration histograms summed bucket by bucket, so the percentiles drawn from them are those of every completion of
    the window, exactly as over one key. Paused as key 0 (a pause is set on every key at once)."""
    first = rows[0]
    return dataclasses.replace(
        first,
        **{name: sum(getattr(r, name) for r in rows) for name in _SUMMED},
        oldest_ready_age=_oldest(r.oldest_ready_age for r in rows),
        w_duration_max_ms=max((r.w_duration_max_ms for r in rows if r.w_duration_max_ms is not None), default=None),
        w_durations_ms=add_histograms(r.w_durations_ms for r in rows),
        estimated=any(r.estimated for r in rows),
        counted_at=_earliest(r.counted_at for r in rows),
    )


def add_groups(rows: Sequence[GroupsRow], top: int) -> GroupsRow:
    """A spread queue's top groups from each key's top `top`: a group's figures summed over the keys that list it,
    the most ready first. A key that listed `top` groups may have left out some of its groups, whose sums here are
    then too low, or missing: then the answer is marked estimated."""
    ready: dict[str, int] = {}
    running: dict[str, int] = {}
    for r in rows:
        for g in r.groups:
            ready[g["group"]] = ready.get(g["group"], 0) + g["ready"]
            running[g["group"]] = running.get(g["group"], 0) + g["running"]
    best = sorted(ready, key=lambda name: (-ready[name], name))[:top]
    cut = any(len(r.groups) >= top for r in rows)
    estimated = cut or any(r.estimated for r in rows)
    return GroupsRow(
        groups=[{"group": g, "ready": ready[g], "running": running[g]} for g in best],
        estimated=estimated,
        counted_at=_earliest(r.counted_at for r in rows),
    )


def sort_key(order: str) -> Callable[[Sequence[Any]], Any]:
    """A Python sort key for tuples of a listing's sort values that orders them as its SQL ORDER BY `order`
    ("j.priority DESC, j.run_at, j.id") does."""
    descending = [term.strip().upper().endswith(" DESC") for term in order.split(",")]

    def compare(a: Sequence[Any], b: Sequence[Any]) -> int:
        for x, y, desc in zip(a, b, descending, strict=True):
            if x != y:
                before = x < y
                return (1 if before else -1) if desc else (-1 if before else 1)
        return 0

    return cmp_to_key(compare)


def merge_pages(pages: Iterable[Sequence[T]], order: str, values: Callable[[T], Sequence[Any]]) -> list[T]:
    """Pages of one listing, each of one key and in the listing's `order`, merged into one list in that order
    (`values`: a row's sort values)."""
    key = sort_key(order)
    return list(heapq.merge(*pages, key=lambda row: key(values(row))))
