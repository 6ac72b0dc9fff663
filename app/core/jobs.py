"""What each endpoint does, between a validated request and the store: limits that depend on the
settings, group commit for the hot writes, and the mapping of store outcomes to API errors."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from app.core.coalesce import Coalescer
from app.core.dispatcher import ClaimDispatcher
from app.db import jobs as store
from app.db.jobs import ClaimSlot, Completion, Done, Heartbeat, NewJob, Outcome, Row
from app.db.pool import Database
from app.errors import BadRequest, ClaimLost, JobCancelled, JobNotFound, ValidationFailed
from app.models.jobs import (
    ClaimRequest,
    CompleteBatchRequest,
    CompleteRequest,
    EnqueueRequest,
    FailRequest,
    HeartbeatRequest,
    InvalidUnicode,
    JsonValueError,
    ReleaseRequest,
    check_json_value,
    dump_json,
)
from app.runtime.metrics import Metrics
from app.settings import Settings

Doc = dict[str, Any]
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def invalid(loc: Sequence[str | int], msg: str, kind: str = "value_error") -> ValidationFailed:
    """A 422 shaped like pydantic's, for the checks that JSON Schema cannot express."""
    where = ".".join(str(p) for p in loc)
    return ValidationFailed(f"{where}: {msg}", errors=[{"loc": list(loc), "msg": msg, "type": kind}])


def sanitise_error(text: str, max_bytes: int) -> str:
    """Error text as stored: control characters (other than tab and newline) removed, cut to max_bytes
    of UTF-8 on a character boundary with a visible marker."""
    text = _CONTROL.sub("", text)
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    marker = " [truncated]"
    return raw[: max_bytes - len(marker)].decode(errors="ignore") + marker


def _raise_for(outcome: Outcome) -> None:
    if outcome == "not_found":
        raise JobNotFound()
    if outcome == "claim_lost":
        raise ClaimLost()
    if outcome == "cancelled":
        raise JobCancelled()


class JobService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        dispatcher: ClaimDispatcher,
        wake: Callable[[Iterable[str]], None],
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.db = db
        self.dispatcher = dispatcher
        self.wake = wake
        self.metrics = metrics
        # Group commit for the hot single-row writes (see app/core/coalesce.py). An enqueue item is one
        # request's jobs, so a batch stays all-or-nothing even when it shares a statement.
        self._insert: Coalescer[list[NewJob], list[tuple[bool, Row]]] = Coalescer(
            self._insert_many,
            max_items=max(1000, settings.max_batch_jobs),
            max_inflight=2,
            weight=len,
            isolate=lambda exc: isinstance(exc, ValidationFailed),
        )
        self._complete: Coalescer[Completion, Done] = Coalescer(self._complete_many, max_items=1000, max_inflight=2)
        self._heartbeat: Coalescer[Heartbeat, tuple[Outcome, Any]] = Coalescer(
            self._heartbeat_many, max_items=1000, max_inflight=2
        )

    async def aclose(self) -> None:
        for c in (self._insert, self._complete, self._heartbeat):
            await c.aclose()

    # -- checks ------------------------------------------------------------------------------------------

    def _json(self, value: Any, limit: int, loc: Sequence[str | int]) -> str:
        try:
            check_json_value(value, self.settings.max_json_depth)
        except InvalidUnicode as exc:
            raise BadRequest(f"The request body is not valid JSON: {exc}") from None
        except JsonValueError as exc:
            raise invalid(loc, str(exc)) from None
        text = dump_json(value)
        if len(text) > limit // 4 and len(text.encode()) > limit:
            raise invalid(loc, f"larger than {limit} bytes of JSON", "too_large")
        return text

    def _new_job(self, queue: str, req: EnqueueRequest, loc: Sequence[str | int]) -> NewJob:
        return NewJob(
            queue=queue,
            payload=self._json(req.payload, self.settings.max_payload_bytes, [*loc, "payload"]),
            priority=req.priority,
            run_at=req.run_at,
            delay_seconds=req.delay_seconds,
            max_attempts=req.max_attempts or self.settings.default_max_attempts,
            idempotency_key=req.idempotency_key,
        )

    # -- producers ------------------------------------------------------------------------------------------

    async def _insert_many(self, requests: list[list[NewJob]]) -> list[list[tuple[bool, Row]]]:
        flat = [job for jobs in requests for job in jobs]
        async with self.db.connection() as conn:
            rows = await store.jobs_insert(conn, flat)
        self.wake({job.queue for job in flat})
        self.metrics.count_many("enqueued", (row[1] for created, row in rows if created))
        out, at = [], 0
        for jobs in requests:
            out.append(rows[at : at + len(jobs)])
            at += len(jobs)
        return out

    async def enqueue(self, queue: str, req: EnqueueRequest) -> tuple[bool, Doc]:
        """(created, job): created is False when the idempotency key already named a job."""
        [(created, row)] = await self._insert([self._new_job(queue, req, ["body"])])
        return created, store.job_doc(row)

    async def enqueue_batch(self, queue: str, reqs: Sequence[EnqueueRequest]) -> list[tuple[bool, Doc]]:
        jobs = [self._new_job(queue, r, ["body", "jobs", i]) for i, r in enumerate(reqs)]
        # A key that occurs twice names one job, as it would in two requests: the later occurrence gets
        # the job of the first (store.jobs_insert).
        rows = await self._insert(jobs)
        return [(created, store.job_doc(row)) for created, row in rows]

    # -- workers ------------------------------------------------------------------------------------------------

    async def claim(self, queue: str, req: ClaimRequest, disconnected: Awaitable[Any] | None = None) -> list[Doc]:
        slot = ClaimSlot(req.worker, req.lease_seconds or self.settings.lease_default_seconds, req.limit)
        rows = await self.dispatcher.claim(queue, slot, req.wait_seconds, disconnected)
        return [store.claim_doc(r) for r in rows]

    async def _heartbeat_many(self, beats: list[Heartbeat]) -> list[tuple[Outcome, Any]]:
        async with self.db.connection() as conn:
            return await store.jobs_heartbeat(conn, beats)

    # Routes addressed by job id take `allowed`: the caller's queue regex (None: every queue). A job in
    # another queue is "not_found", decided in the same guarded statement (see app/auth/policy.py).

    async def heartbeat(self, job_id: int, req: HeartbeatRequest, allowed: str | None = None) -> Doc:
        outcome, expires = await self._heartbeat(Heartbeat(job_id, req.claim_token, req.lease_seconds, allowed))
        if outcome == "cancelled":
            # Cooperative cancel: the worker learns it here, stops, and does not complete.
            return {"id": job_id, "lease_expires_at": None, "cancel_requested": True}
        _raise_for(outcome)
        return {"id": job_id, "lease_expires_at": expires, "cancel_requested": False}

    async def _complete_many(self, items: list[Completion]) -> list[Done]:
        async with self.db.connection() as conn:
            done = await store.jobs_complete(conn, items)
        self._count_completed(done)
        return done

    def _count_completed(self, done: Sequence[Done]) -> None:
        per_queue: dict[str, list[float]] = {}
        for _, row, changed in done:
            if changed and row is not None:
                duration = (row[11] - row[9]).total_seconds() * 1000  # finished_at - claimed_at
                per_queue.setdefault(row[1], []).append(duration)
        for queue, durations in per_queue.items():
            self.metrics.completed(queue, durations)

    def _result(self, value: Any, loc: Sequence[str | int]) -> str | None:
        return None if value is None else self._json(value, self.settings.max_result_bytes, loc)

    async def complete(self, job_id: int, req: CompleteRequest, allowed: str | None = None) -> Doc:
        result = self._result(req.result, ["body", "result"])
        outcome, row, _ = await self._complete(Completion(job_id, req.claim_token, result, allowed))
        _raise_for(outcome)
        assert row is not None
        return store.job_doc(row)

    async def complete_batch(self, req: CompleteBatchRequest, allowed: str | None = None) -> list[Doc]:
        # An id may occur twice (one item is a retry of the other): each gets its own outcome, and of the
        # items with the claim's token the first one's result is kept (store.jobs_complete).
        items = [
            Completion(item.id, item.claim_token, self._result(item.result, ["body", "jobs", i, "result"]), allowed)
            for i, item in enumerate(req.jobs)
        ]
        async with self.db.connection() as conn:
            outcomes = await store.jobs_complete(conn, items, full=False)
        self._count_completed(outcomes)
        return [
            {
                "id": item.id,
                "outcome": "completed" if outcome == "ok" else outcome,
                "status": row[2] if row is not None else None,
            }
            for item, (outcome, row, _) in zip(items, outcomes, strict=True)
        ]

    async def fail(self, job_id: int, req: FailRequest, allowed: str | None = None) -> Doc:
        async with self.db.connection() as conn:
            outcome, row, changed = await store.job_fail(
                conn,
                job_id,
                req.claim_token,
                sanitise_error(req.error, self.settings.max_error_bytes),
                allowed=allowed,
                retry=req.retry,
                retry_in=req.retry_in_seconds,
                backoff_base=self.settings.backoff_base_seconds,
                backoff_cap=self.settings.backoff_cap_seconds,
            )
        _raise_for(outcome)
        assert row is not None
        if changed:
            self.metrics.count("failed" if row[2] == "failed" else "retried", row[1])
            if row[2] == "pending" and req.retry_in_seconds == 0:
                self.wake([row[1]])  # a retry asked for now: waiting long-polls take it
        return store.job_doc(row)

    async def release(self, job_id: int, req: ReleaseRequest, allowed: str | None = None) -> Doc:
        """Hand a claimed job back untried: pending again, the claim's attempt not counted. A job whose
        cancel was requested answers job-cancelled, as complete does: the operator's cancel wins, and the
        worker learns the job will not come back."""
        async with self.db.connection() as conn:
            outcome, row, changed = await store.job_release_claim(
                conn, job_id, req.claim_token, req.delay_seconds, allowed
            )
        _raise_for(outcome)
        assert row is not None
        if changed:
            self.metrics.count("released", row[1])
            if req.delay_seconds == 0:
                self.wake([row[1]])  # claimable now: waiting long-polls take it (later: the fallback poll)
        return store.job_doc(row)

    # -- reads -------------------------------------------------------------------------------------------------------

    async def get(self, job_id: int, allowed: str | None = None) -> Doc:
        async with self.db.connection() as conn:
            row = await store.job_get(conn, job_id, allowed)
        if row is None:
            raise JobNotFound()
        return store.job_doc(row)
