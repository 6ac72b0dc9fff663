"""Response bodies of the worker registry (GET /workers, GET /workers/{name})."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.models.fields import Json


class WorkerSummary(BaseModel):
    name: str = Field(description="The `worker` its claims named (the SDKs send `<host>-<pid>`).")
    state: Literal["live", "gone"] = Field(
        description="`live` while it holds a lease that has not lapsed or was seen within "
        "JOBQ_WORKER_GONE_SECONDS; `gone` otherwise."
    )
    queues: list[str] = Field(description="The queues it claimed from (of those this key may use).")
    sdk: str | None = Field(description="From its User-Agent's first product, e.g. `jobq-client-python`.")
    version: str | None = Field(description="The SDK's version, from the same product.")
    host: str | None = Field(description="The User-Agent's `host=` comment, else the address it called from.")
    first_seen: datetime
    last_seen: datetime = Field(description="Its latest claim, heartbeat, complete or fail (within a second).")
    jobs_held: int = Field(description="Jobs it holds now (running under its claims).")
    job_ids: list[int] = Field(description="Ids of the jobs it holds, oldest claim first (the first 100).")
    lease_expires_at: datetime | None = Field(description="When the latest lease it holds lapses; null: none.")
    completed_last_hour: int = Field(description="Jobs it completed in the last hour.")
    failed_last_hour: int = Field(description="Attempts it failed in the last hour (fails, and hard timeouts).")


class WorkerList(BaseModel):
    workers: list[WorkerSummary] = Field(description="Live workers first, then by when last seen, newest first.")


class HeldJob(BaseModel):
    id: int = Field(json_schema_extra={"format": "int64"})
    queue: str
    attempts: int
    max_attempts: int
    claimed_at: datetime
    lease_expires_at: datetime
    progress: Json = Field(description="What the worker last reported for the job (heartbeat `progress`); null: none.")


class WorkerDetail(WorkerSummary):
    jobs: list[HeldJob] = Field(description="The jobs it holds now, oldest claim first.")
