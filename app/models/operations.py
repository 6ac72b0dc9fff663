"""Request and response bodies of the operator endpoints: statistics, listings, admin actions."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, Strict, StrictBool

from app.models.answers import Job, ReadReplica, Replication
from app.models.fields import Body, Integral, Maybe, omitted
from app.models.flow import QueueConfig, RateLimit


class QueueCounts(BaseModel):
    ready: int = Field(description="Pending jobs that are due: what a claim would get now.")
    scheduled: int = Field(description="Pending jobs whose run_at is in the future (delayed or backing off).")
    pending: int = Field(description="ready + scheduled.")
    waiting: int = Field(description="Jobs waiting for the jobs they depend on to finish (`depends_on`).")
    running: int = Field(description="Jobs held by a claim.")
    completed: int = Field(description="Completed jobs still kept (see retention).")
    failed: int = Field(description="Failed jobs (the dead-letter set) still kept.")
    cancelled: int = Field(description="Cancelled jobs still kept.")


class DurationStats(BaseModel):
    count: int = Field(description="Completions measured in the window.")
    p50_ms: float | None = Field(description="Median claim-to-completion time (histogram estimate, see README).")
    p95_ms: float | None = Field(description="95th percentile claim-to-completion time (histogram estimate).")
    max_ms: float | None = Field(description="Longest claim-to-completion time (exact).")


class HeldBack(BaseModel):
    concurrency: int = Field(description="By `concurrency` (the queue's running jobs).")
    rate: int = Field(description="By `rate` (the queue's claims in the window).")
    group_concurrency: int = Field(description="By `group_concurrency` (a group's running jobs).")
    group_rate: int = Field(description="By `group_rate` (a group's claims in the window).")
    ordered: int = Field(description="By `ordered` (a group's next job waiting for its retry).")


class GroupStats(BaseModel):
    group: str
    ready: int = Field(description="Pending jobs of the group that are due.")
    running: int = Field(description="Jobs of the group held by a claim.")


class WindowStats(BaseModel):
    seconds: int = Field(description="Length of the window these figures cover, ending now.")
    enqueued: int = Field(description="Jobs enqueued.")
    claimed: int = Field(description="Jobs handed to workers.")
    completed: int = Field(description="Jobs completed.")
    completions_per_minute: float = Field(description="completed / window minutes.")
    retries: int = Field(description="Failed attempts sent back to pending for another try.")
    failures: int = Field(description="Jobs that failed for good (terminal), by a worker or the sweeper.")
    lease_expired: int = Field(description="Claims whose lease lapsed and that the sweeper recovered.")
    cancelled: int = Field(description="Jobs cancelled by an operator.")
    released: int = Field(
        description="Claimed jobs handed back untried by their worker (POST /jobs/{id}/release); the attempt is "
        "given back, so a queue whose jobs are released again and again never fails them: watch this."
    )
    empty_claims_with_ready_jobs: int = Field(
        description="Claim requests answered empty while ready jobs existed (all locked by other claims, "
        "or the queue paused): a sign of contention or of a paused queue."
    )
    held_back: HeldBack = Field(
        description="Claim requests answered with fewer jobs than they asked for while ready jobs were held "
        "back by a limit of the queue's configuration, by limit."
    )
    duration: DurationStats = Field(description="Claim-to-completion times of the jobs completed in the window.")


class DatabaseHealth(BaseModel):
    """What holds back the vacuuming of the jobs table, for every queue alike."""

    jobs_dead_rows: int = Field(
        description="Dead row versions in the jobs table (PostgreSQL's statistics). Claims walk over their index "
        "entries until VACUUM removes them."
    )
    oldest_xmin_age_seconds: float = Field(
        description="How long the oldest snapshot that VACUUM must respect has been held (a long transaction, a "
        "prepared transaction; 0 when none). While it is held, no dead row made since can be removed."
    )
    oldest_xmin_age_transactions: int = Field(
        description="The same holder's age in transaction ids (replication slots included)."
    )
    replication: Replication | None = Field(
        description="Whether the primary replicates synchronously (null until a connection has read it)."
    )
    read_replica: ReadReplica | None = Field(
        description="The read replica's lag and whether it served this answer's counts; null without one."
    )


class QueueStats(BaseModel):
    queue: str
    paused: bool = Field(description="A paused queue accepts jobs but every claim returns empty.")
    counts: QueueCounts
    oldest_ready_age_seconds: float | None = Field(
        description="How long the oldest ready job has been due; null when none is ready."
    )
    counts_estimated: bool = Field(
        description="True when a count of live jobs (ready, scheduled, running, waiting, and the jobs on their last "
        "attempts) passed JOBQ_STATS_EXACT_MAX, in this answer's read or in the background's last count: that figure "
        "is then the background's count of `counts_counted_at` (refreshed every JOBQ_LIVE_COUNTS_INTERVAL_SECONDS; "
        "a kind a recent count found past the maximum is not read again, so a queue drained since shows the older "
        "figure until the next count), never below what this answer saw itself. False: every count is exact as of "
        "the answer."
    )
    counts_counted_at: datetime | None = Field(
        description="When the background counted the estimated figures; null when none is estimated, or when the "
        "queue has not been counted yet (the figures are then at least JOBQ_STATS_EXACT_MAX)."
    )
    jobs_on_last_attempt: int = Field(description="Pending or running jobs with no attempt left after this one.")
    jobs_one_attempt_left: int = Field(description="Pending or running jobs one attempt short of max_attempts.")
    window: WindowStats
    database: DatabaseHealth
    as_of: datetime = Field(description="Database time of the figures.")
    config: QueueConfig = Field(description="The queue's configuration: its defaults and limits.")
    groups: list[GroupStats] = Field(description="The 20 groups with the most ready jobs, most first.")
    groups_estimated: bool = Field(
        description="True when the queue's pending jobs that have a group, or the running jobs of these groups, "
        "passed JOBQ_STATS_EXACT_MAX: the groups this answer did not read whole are then the background's top groups "
        "of `groups_counted_at`, each figure never below what this answer saw itself. False: `groups` is exact as of "
        "the answer.",
    )
    groups_counted_at: datetime | None = Field(
        description="When the background counted the estimated groups; null when `groups_estimated` is false, or "
        "when the queue has not been counted yet (`groups` is then what this answer read).",
    )


class QueueSummary(BaseModel):
    queue: str
    paused: bool
    counts: QueueCounts
    oldest_ready_age_seconds: float | None
    counts_estimated: bool = Field(
        description="True when a count of live jobs (ready, scheduled, running, waiting, and the jobs on their last "
        "attempts) passed JOBQ_STATS_EXACT_MAX: that figure is then the background's count of `counts_counted_at` "
        "(refreshed every JOBQ_LIVE_COUNTS_INTERVAL_SECONDS), never below what this answer saw itself. False: "
        "every count is exact as of the answer."
    )
    counts_counted_at: datetime | None = Field(
        description="When the background counted the estimated figures; null when none is estimated, or when the "
        "queue has not been counted yet (the figures are then at least JOBQ_STATS_EXACT_MAX)."
    )


QUEUES_PAGE_DEFAULT = 1000  # GET /queues without `limit`: every queue of a service with up to this many
QUEUES_PAGE_MAX = 1000


class QueueList(BaseModel):
    queues: list[QueueSummary] = Field(description="By name.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class JobPage(BaseModel):
    jobs: list[Job]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class CancelRequest(Body):
    reason: Maybe[Annotated[str, Field(max_length=1000)]] = omitted("Kept as the job's last_error.")


class RedriveRequest(Body):
    error_contains: Maybe[Annotated[str, Field(min_length=1, max_length=1000)]] = omitted(
        "Only failed jobs whose last_error contains this text."
    )
    dry_run: StrictBool = Field(False, description="Only count what would be redriven.")
    limit: Maybe[Annotated[int, Strict(), Field(ge=1, le=1_000_000), Integral]] = omitted(
        "Redrive at most this many (oldest first)."
    )


class RedriveResult(BaseModel):
    queue: str
    dry_run: bool
    jobs: int = Field(description="Jobs moved back to pending (or that would be, with dry_run).")


class QueueState(BaseModel):
    queue: str
    paused: bool


class ScaleLimits(BaseModel):
    concurrency: int | None = Field(description="The queue's concurrency limit; null: none.")
    rate: RateLimit | None = Field(description="The queue's rate limit; null: none.")


class QueueScale(BaseModel):
    """What an autoscaler needs of a queue, from one cheap statement (docs/autoscaling.md)."""

    queue: str
    claimable: int = Field(
        description="How many more jobs claims could take right now: the ready jobs that the queue's limits let "
        "through (concurrency and rate less what counts against them, group limits per group), 0 while paused. "
        "Scale workers on this, not on `ready`."
    )
    ready: int = Field(description="Pending jobs that are due, counted up to `max`.")
    capped: bool = Field(description="A count stopped at a bound (`max`, 100 priority levels, 1,000 groups).")
    running: int = Field(description="Jobs in flight (held by a claim).")
    oldest_ready_age_seconds: float | None = Field(description="Age of the oldest ready job; null: none ready.")
    paused: bool
    held_by: list[Literal["paused", "concurrency", "rate", "groups"]] = Field(
        description="What keeps `claimable` below `ready` now; empty: nothing."
    )
    limits: ScaleLimits
