"""Why a job is not running: the rules of the claim that hold it right now, as data (GET /jobs/{id}/explain),
from one statement made of the claim's own fragments (app/db/explain.py).

A reason per rule that holds the job: `paused`; `scheduled` (due later, never tried) or `backoff` (due
later after a failed attempt); `concurrency` and `rate` (the queue's limits, full); `group_concurrency`,
`group_rate` (its group's); `ordered` (not its group's turn); `dependencies` (waiting for other jobs). A job
that is running or finished says so. `runnable` is true when nothing holds it: the next claim may take it,
in claim order (priority, then run_at, then id) among the other runnable jobs of its queue."""

from __future__ import annotations

from typing import Any

from app.db import explain as store_explain
from app.db.jobs import job_get
from app.db.pool import Database
from app.db.rows import FINISHED, JobRow, Status
from app.db.spread import logical
from app.errors import JobNotFound

Doc = dict[str, Any]


def reasons_of(job: JobRow, row: store_explain.ExplainRow | None, waiting_for: list[int] | None = None) -> list[Doc]:
    """`row`: the claim's rules, read for a pending job; `waiting_for`: a waiting job's parents not finished."""
    if job.status == Status.running:
        return [{"kind": "running", "worker": job.worker, "lease_expires_at": job.lease_expires_at}]
    if job.status in FINISHED:
        return [{"kind": "finished", "status": job.status}]
    if job.status == Status.waiting:
        return [{"kind": "dependencies", "waiting_for": waiting_for or []}]
    if row is None:  # gone between the two reads
        return []
    out: list[Doc] = []
    if row.paused:
        out.append({"kind": "paused"})
    if row.not_due:
        if job.attempts > 0:
            out.append({"kind": "backoff", "run_at": job.run_at, "attempts": job.attempts,
                        "last_error": job.last_error})  # fmt: skip
        else:
            out.append({"kind": "scheduled", "run_at": job.run_at})
    if row.concurrency is not None and row.running >= row.concurrency:
        out.append({"kind": "concurrency", "limit": row.concurrency, "held_by": row.running_ids})
    if row.rate_limit is not None and row.recent >= row.rate_limit:
        out.append({"kind": "rate", "limit": row.rate_limit, "per_seconds": row.rate_per_seconds,
                    "until": row.rate_frees_at})  # fmt: skip
    if job.group is not None:
        if row.group_concurrency is not None and row.group_running >= row.group_concurrency:
            out.append({"kind": "group_concurrency", "group": job.group, "limit": row.group_concurrency,
                        "held_by": row.group_running_ids})  # fmt: skip
        if row.group_rate_limit is not None and row.group_recent >= row.group_rate_limit:
            out.append({"kind": "group_rate", "group": job.group, "limit": row.group_rate_limit,
                        "per_seconds": row.group_rate_per_seconds, "until": row.group_rate_frees_at})  # fmt: skip
        if row.ordered and row.head_id is not None and row.head_id != job.id:
            out.append({"kind": "ordered", "group": job.group, "behind": row.head_id})
    return out


class ExplainService:
    """On the primary, never the read replica: it answers for the claim as it would run now, often about a
    job the caller has just enqueued or changed (a replica a moment behind would say it does not exist, or
    name a limit that is no longer full)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def explain(self, job_id: int, allowed: str | None) -> Doc:
        async with self.db.connection() as conn:
            job = await job_get(conn, job_id, allowed)
            if job is None:
                raise JobNotFound()
            row, waiting_for = None, None
            if job.status == Status.pending:
                row = await store_explain.job_explain(conn, job_id, job.queue, allowed)
            elif job.status == Status.waiting:
                waiting_for = await store_explain.job_waiting_for(conn, job_id, job.depends_on or [], allowed)
        reasons = reasons_of(job, row, waiting_for)
        # The queue a person named: a job under a key of a spread queue is the queue's (app/db/spread.py).
        return {"id": job.id, "queue": logical(job.queue), "status": job.status, "runnable": not reasons,
                "reasons": reasons}  # fmt: skip
