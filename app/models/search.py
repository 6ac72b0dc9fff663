"""Request and response bodies of job search and bulk actions."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, Field, Strict, StrictBool, model_validator

from app.db.rows import Status
from app.models.answers import Job
from app.models.fields import QUEUE_PATTERN, Body, Integral, JobId, Json, Label, Maybe, omitted

SEARCH_PAGE_MAX = 100
BULK_MAX_JOBS = 1000  # jobs one bulk request may name or act on: each is one row lock in one statement

QueueName = Annotated[str, Field(pattern=QUEUE_PATTERN)]
ErrorText = Annotated[str, Field(min_length=1, max_length=1000)]
Cursor = Annotated[str, Field(min_length=1, max_length=1000)]


class JobFilter(Body):
    queue: Maybe[QueueName] = omitted("Only jobs of this queue.")
    status: Maybe[Status] = omitted("Only jobs in this status.")
    id: Maybe[JobId] = omitted("The job with this id.")
    idempotency_key: Maybe[Label] = omitted("Jobs enqueued with this idempotency key (one per queue at most).")
    error_contains: Maybe[ErrorText] = omitted("Jobs whose last_error contains this text (case-sensitive).")
    payload_contains: Maybe[Json] = omitted(
        "Jobs whose payload contains this JSON value (PostgreSQL `@>`: an object matches when it holds these keys "
        "with these values, an array when it holds these elements). Indexed for failed and cancelled jobs."
    )

    def conditions(self) -> int:
        return sum(v is not None for v in (self.queue, self.status, self.id, self.idempotency_key,
                                           self.error_contains, self.payload_contains))  # fmt: skip


class SearchRequest(JobFilter):
    limit: Annotated[int, Strict(), Field(ge=1, le=SEARCH_PAGE_MAX), Integral] = Field(50, description="Page size.")
    cursor: Maybe[Cursor] = omitted("next_cursor of the previous page of the same search.")


class SearchResult(BaseModel):
    jobs: list[Job] = Field(description="The matches of this page, in the order searched (see the operation).")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null when nothing is left.")
    examined: int = Field(
        description="Jobs this page looked at, of the queues this key may use (the jobs of other queues it walks "
        "past are not counted)."
    )
    partial: bool = Field(
        description="The page stopped at the search's scan limit (JOBQ_SEARCH_SCAN_ROWS) before it was full: "
        "more jobs may match further on. Follow next_cursor."
    )


class BulkRequest(Body):
    action: Literal["cancel", "retry"] = Field(
        description="`cancel`: pending, waiting and running jobs, as POST /jobs/{id}/cancel; `retry`: failed, "
        "cancelled and completed jobs, as POST /jobs/{id}/retry (a filter without `status` retries failed and "
        "cancelled ones: completed jobs are replayed only when named, by id or by `status: completed`)."
    )
    ids: Maybe[Annotated[list[JobId], Field(min_length=1, max_length=BULK_MAX_JOBS)]] = omitted(
        f"The jobs to act on (at most {BULK_MAX_JOBS}). Give `ids` or `filter`."
    )
    filter: Maybe[JobFilter] = omitted(
        "Act on the jobs a search with this filter finds, among those the action applies to (a `status`, "
        "if given, must be one of them); at least one condition. Give `ids` or `filter`."
    )
    dry_run: StrictBool = Field(False, description="Change nothing: answer what would be done.")
    limit: Maybe[Annotated[int, Strict(), Field(ge=1, le=BULK_MAX_JOBS), Integral]] = omitted(
        f"With `filter`: act on at most this many jobs (default and most: {BULK_MAX_JOBS})."
    )
    cursor: Maybe[Cursor] = omitted("With `filter`: next_cursor of the previous call, to go on where it stopped.")
    reason: Maybe[Annotated[str, Field(max_length=1000)]] = omitted("With `cancel`: kept as each job's last_error.")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give `ids` or `filter`, one of them")
        if self.ids is not None and (self.limit is not None or self.cursor is not None):
            raise ValueError("`limit` and `cursor` go with `filter`, not with `ids`")
        if self.filter is not None and self.filter.conditions() == 0:
            raise ValueError("`filter` needs at least one condition (an empty one would select every job)")
        if self.reason is not None and self.action != "cancel":
            raise ValueError("`reason` goes with `cancel` only")
        return self


class BulkOutcome(BaseModel):
    id: int
    outcome: Literal["done", "skipped", "not_found"] = Field(
        description="`done`: the action changed the job (with dry_run: would change it); `skipped`: its status "
        "does not allow the action; `not_found`: no such job (or none this key may see)."
    )
    status: Status | None = Field(description="The job's status after the call; null when not found.")


class BulkResult(BaseModel):
    action: Literal["cancel", "retry"]
    dry_run: bool
    jobs: list[BulkOutcome] = Field(description="One per job named or found, in that order.")
    done: int = Field(description="Jobs changed (with dry_run: that would be).")
    skipped: int = Field(description="Jobs whose status does not allow the action.")
    not_found: int = Field(description="Ids that name no job this key may see.")
    next_cursor: str | None = Field(description="With `filter`: pass as `cursor` to go on; null when done.")
    partial: bool = Field(
        description="With `filter`: the search stopped at its scan limit before finding `limit` jobs; more may "
        "match further on (follow next_cursor)."
    )
