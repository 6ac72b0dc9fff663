"""Job search and bulk actions: a filter becomes a bounded walk of one index (app/db/search.py), a page
of matches and where to go on; a bulk action cancels or retries the jobs named, or a page of those a
filter finds, in one statement guarded by each job's status exactly as the single cancel and retry."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from app.core.cursors import BadCursor, decode_cursor, encode_cursor
from app.core.dependencies import DependencyRelease
from app.core.effects import Effects, Moves, Path
from app.core.flow import QueueConfigs
from app.core.jobs import invalid, json_text, sanitise_error
from app.db import admin as store_admin
from app.db import search as store_search
from app.db.admin import CANCELLABLE, RETRYABLE, RETRYABLE_BY_DEFAULT
from app.db.operations import LISTINGS
from app.db.pool import Database
from app.db.replica import Conn, Reads
from app.db.rows import JobRow
from app.db.search import BY_ID, Criteria, Plan, SearchRow
from app.db.spread_reads import merge_pages, sort_key
from app.errors import SearchTooBroad, StatementTimeout, TooManySearches
from app.models.search import BULK_MAX_JOBS, BulkRequest, JobFilter
from app.settings import Settings

Doc = dict[str, Any]
APPLIES_TO = {"cancel": CANCELLABLE, "retry": RETRYABLE}
BY_DEFAULT = {"cancel": CANCELLABLE, "retry": RETRYABLE_BY_DEFAULT}  # a filter that names no status


@dataclass(frozen=True, slots=True)
class Found:
    jobs: list[JobRow]
    next_cursor: str | None
    examined: int
    partial: bool


class SearchService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        reads: Reads,
        effects: Effects,
        release: DependencyRelease,
        configs: QueueConfigs,
    ) -> None:
        self.configs = configs  # a spread queue's keys (app/db/spread.py)
        self.dependants = release  # the jobs waiting for those a bulk cancel cancelled
        self.settings = settings
        self.db = db
        self.reads = reads  # a search from the API may lag a little; a bulk action's, not
        self.effects = effects
        # Searches running now, per client and in all: each holds a pooled connection for up to
        # JOBQ_SEARCH_TIMEOUT_MS, and 20 at once by one key took the pool from everyone else's enqueues.
        self._running: dict[str, int] = {}
        self._total = 0

    @contextmanager
    def _slot(self, client: str | None) -> Iterator[None]:
        """A place among the searches running at once: JOBQ_MAX_SEARCHES_PER_KEY for one client (a key, or
        with keys off an address), JOBQ_MAX_SEARCHES in all; past either, 429 at once (never a queue)."""
        mine = self._running.get(client, 0) if client is not None else 0
        if client is not None and mine >= self.settings.max_searches_per_key:
            raise TooManySearches(
                f"This client already runs {mine} searches on this server (JOBQ_MAX_SEARCHES_PER_KEY); wait for "
                "one to end."
            )
        if self._total >= self.settings.search_cap:
            raise TooManySearches(f"This server already runs {self._total} searches (JOBQ_MAX_SEARCHES); retry soon.")
        self._total += 1
        if client is not None:
            self._running[client] = mine + 1
        try:
            yield
        finally:
            self._total -= 1
            if client is not None:
                left = self._running[client] - 1
                if left:
                    self._running[client] = left
                else:
                    del self._running[client]

    def criteria(self, f: JobFilter, statuses: tuple[str, ...] | None, loc: Sequence[str]) -> Criteria:
        payload = None
        if f.payload_contains is not None:
            limit = self.settings.max_payload_bytes
            payload = json_text(f.payload_contains, limit, self.settings.max_json_depth, [*loc, "payload_contains"])
        return Criteria(
            queue=f.queue,
            statuses=statuses,
            id=f.id,
            idempotency_key=f.idempotency_key,
            error_contains=f.error_contains,
            payload=payload,
        )

    async def search(
        self,
        c: Criteria,
        allowed: str | None,
        limit: int,
        cursor: str | None,
        loc: Sequence[str] = ("body",),
        client: str | None = None,
        replica: bool = False,
    ) -> Found:
        """A page of at most `limit` matches, newest first or in the listing's order (app/db/search.py). `client`:
        whose share of the searches running at once it takes (see _slot); `replica`: on the read replica when
        there is one and it is close enough (a search an operator reads, not one a bulk action acts on)."""
        how = store_search.plan(c)
        after = None
        if cursor is not None:
            try:
                after = decode_cursor(cursor, how.cursor_kind)
            except BadCursor:
                raise invalid([*loc, "cursor"], "not a cursor of this search; start again without one") from None
        if c.error_contains is not None and "\x00" in c.error_contains:
            return Found([], None, 0, False)  # stored errors never hold NUL (PostgreSQL text cannot)
        budget = self.settings.search_scan_rows

        # A spread queue (app/db/spread.py) is searched key by key, each walk on its own key (one shard on Citus)
        # and the budget shared among them, so that a page examines no more jobs than one of any other queue.
        names = (await self.configs.get(c.queue)).keys if c.queue is not None else ()
        keys = [replace(c, queue=k) for k in names] or [c]
        budget_each = max(1, budget // len(keys))

        async def read(conn: Conn) -> list[list[SearchRow]]:
            timeout = self.settings.search_timeout_ms
            return [
                await store_search.jobs_search(conn, how, k, allowed, after, limit + 1, budget_each, timeout)
                for k in keys
            ]

        try:
            with self._slot(client):
                if replica:
                    pages = await self.reads.run(read)
                else:
                    async with self.db.connection() as conn:
                        pages = await read(conn)
        except StatementTimeout:
            raise SearchTooBroad(
                f"The search did not finish within {self.settings.search_timeout_ms} ms: narrow it (a queue and a "
                "status, or a more specific filter)."
            ) from None
        if len(pages) == 1:
            return _page(how, pages[0], limit, budget)
        return _merged_page(how, pages, limit, budget_each)

    async def bulk(self, req: BulkRequest, allowed: str | None, client: str | None = None) -> Doc:
        applies = APPLIES_TO[req.action]
        queues = None  # the jobs' queues: those a search found them in, else looked up by id
        if req.ids is not None:
            ids = list(dict.fromkeys(req.ids))  # each once, in the order given
            found = Found([], None, 0, False)
        else:
            assert req.filter is not None
            status = req.filter.status
            if status is not None and status not in applies:
                msg = f"`{req.action}` applies to {' and '.join(applies)} jobs, not {status} ones"
                raise invalid(["body", "filter", "status"], msg)
            statuses = (status.value,) if status is not None else BY_DEFAULT[req.action]
            c = self.criteria(req.filter, statuses, ["body", "filter"])
            found = await self.search(c, allowed, req.limit or BULK_MAX_JOBS, req.cursor, client=client)
            ids = [j.id for j in found.jobs]
            queues = {j.id: j.queue for j in found.jobs}
        outcomes = await self._act(req, ids, applies, allowed, queues) if ids else []
        counts = {kind: sum(o["outcome"] == kind for o in outcomes) for kind in ("done", "skipped", "not_found")}
        return {
            "action": req.action,
            "dry_run": req.dry_run,
            "jobs": outcomes,
            **counts,
            "next_cursor": found.next_cursor,
            "partial": found.partial,
        }

    async def _act(
        self,
        req: BulkRequest,
        ids: list[int],
        applies: tuple[str, ...],
        allowed: str | None,
        queues: dict[int, str] | None,
    ) -> list[Doc]:
        """The action on `ids`, one statement per queue of theirs (app/db/admin.py)."""
        moves: Moves | None = None
        finished: list[JobRow] = []
        async with self.db.connection() as conn:
            if req.dry_run:
                seen = {
                    j.id: (j.status in applies, j) for j in await store_admin.jobs_get_brief(conn, ids, allowed, queues)
                }
            else:
                if req.action == "cancel":
                    reason = (
                        sanitise_error(req.reason, self.settings.max_error_bytes) if req.reason is not None else None
                    )
                    written = await store_admin.jobs_cancel_many(conn, ids, reason, allowed, queues)
                    moves = Moves(Path.BULK_CANCEL)
                else:
                    # By filter, a job whose unique key is held is skipped; by ids, refused (409).
                    skip_held = req.ids is None
                    written = await store_admin.jobs_retry_many(conn, ids, allowed, skip_held, queues)
                    moves = Moves(Path.BULK_RETRY)
                seen = {w.job.id: (w.written, w.job) for w in written if w.job is not None}
                for w in written:
                    if w.written and w.job is not None and w.was is not None:
                        moves.add_jobs(w.job.queue, w.was, w.job.status, (w.job.id,))
                        finished.append(w.job)
        if moves is not None:
            self.effects.apply(moves)
        if req.action == "cancel":
            await self.dependants.after_finish(finished)
        out = []
        for job_id in ids:
            if job_id not in seen:
                out.append({"id": job_id, "outcome": "not_found", "status": None})
            else:
                done, job = seen[job_id]
                out.append({"id": job_id, "outcome": "done" if done else "skipped", "status": job.status})
        return out


def _sort_values(values: Sequence[Any]) -> list[Any]:
    """A sort key as compared: a key a walk reports (JSON: timestamps as text) the same as a job's own."""
    return [datetime.fromisoformat(v) if isinstance(v, str) else v for v in values]


def _merged_page(how: Plan, pages: list[list[SearchRow]], limit: int, budget_each: int) -> Found:
    """The page of a search of a spread queue from its keys' pages (each walked after the same cursor, in the same
    order, up to `budget_each` jobs). A key whose walk stopped at its budget was examined only up to its last job:
    the page shows the matches up to the earliest such stop of any key, in the walk's order, and goes on from
    there; so no match is skipped, and none is shown twice."""
    jobs_of = [[r.job for r in rows if r.job is not None] for rows in pages]
    examined = sum(rows[0].examined for rows in pages if rows)
    order = LISTINGS[how.cursor_kind].order if how.cursor_kind is not None else BY_ID.order
    key = sort_key(order)

    def values(job: JobRow) -> list[Any]:
        return [getattr(job, k) for k in how.keys]

    jobs = merge_pages(jobs_of, order, values)
    if not how.pages:
        return Found(jobs[:limit], None, examined, False)
    stops = [rows[0].last_key for rows in pages if rows and rows[0].examined >= budget_each and rows[0].last_key]
    stop = min(stops, key=lambda k: key(_sort_values(k))) if stops else None
    if stop is not None:
        bound = key(_sort_values(stop))
        jobs = [j for j in jobs if not bound < key(values(j))]
    if len(jobs) > limit:
        jobs = jobs[:limit]
        return Found(jobs, encode_cursor(how.cursor_kind, values(jobs[-1])), examined, False)
    if stop is not None:
        return Found(jobs, encode_cursor(how.cursor_kind, stop), examined, True)
    return Found(jobs, None, examined, False)


def _page(how: Plan, rows: list[SearchRow], limit: int, budget: int) -> Found:
    """The page of matches, and where the next one starts: after the last match shown when there are more
    matches than `limit`, after the last job examined when the walk stopped at its budget."""
    jobs = [r.job for r in rows if r.job is not None]
    examined = rows[0].examined if rows else 0  # jobs of the caller's queues only (app/db/search.py)
    last_key = rows[0].last_key if rows else None
    kind = how.cursor_kind
    if not how.pages:
        return Found(jobs[:limit], None, examined, False)
    if len(jobs) > limit:
        jobs = jobs[:limit]
        return Found(jobs, encode_cursor(kind, [getattr(jobs[-1], k) for k in how.keys]), examined, False)
    if examined >= budget and last_key is not None:
        return Found(jobs, encode_cursor(kind, last_key), examined, True)
    return Found(jobs, None, examined, False)
