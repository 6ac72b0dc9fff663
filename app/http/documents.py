"""The one place where rows become HTTP documents: each document has exactly the fields of its response
model (app/models/), read by name from the row, so the published schema and the answers cannot drift.
JSON columns arrive as text and go out as JSON fragments, never parsed and serialised again."""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from orjson import Fragment
from pydantic import BaseModel

from app.core.scale import Scale
from app.db.flow import QueueConfigRow
from app.db.rows import Inserted, JobRow
from app.db.spread import SEP, logical
from app.db.workers import WorkerRow
from app.models.answers import Claim, CompleteOutcome, HeartbeatResponse, Job, JobState
from app.models.schedules import Schedule
from app.models.workers import HeldJob, WorkerSummary

JSON_FIELDS = frozenset({"payload", "result", "progress", "unique", "debounce"})

Document = dict[str, Any]


def documenter(model: type[BaseModel]) -> Callable[[Any], Document]:
    """A function that turns an object with the model's fields as attributes into the model's document.

    Written out for the model as one dict display (`{"id": row.id, ...}`) and compiled, as namedtuple writes its
    classes: a batch answer makes a thousand documents, and the display takes 1.4 µs a job's document where reading
    the fields with attrgetter and zipping them with their names took 2.1 (BENCHMARKS.md, "Stop 44")."""
    entries = []
    for name in model.model_fields:
        # ASCII only: Python normalises other names in source (NFKC), so `row.ﬁeld` would read `row.field`.
        if not (name.isascii() and name.isidentifier()) or keyword.iskeyword(name):
            raise ValueError(f"{model.__name__}.{name} is not an attribute name")
        if name in JSON_FIELDS:  # JSON text, sent as it is
            entries.append(f"{name!r}: None if (v := row.{name}) is None else Fragment(v)")
        elif name == "queue":
            # A job of a spread queue is stored under one of the queue's keys (`queue#k`, app/db/spread.py): its
            # document names the queue.
            entries.append(f"{name!r}: q if (q := row.{name}) is None or SEP not in q else logical(q)")
        else:
            entries.append(f"{name!r}: row.{name}")
    source = f"def document(row):\n    return {{{', '.join(entries)}}}\n"
    scope: dict[str, Any] = {"Fragment": Fragment, "SEP": SEP, "logical": logical}
    exec(compile(source, f"<document of {model.__name__}>", "exec"), scope)
    document: Callable[[Any], Document] = scope["document"]
    return document


job_document = documenter(Job)
claim_document = documenter(Claim)
renewal_document = documenter(HeartbeatResponse)
outcome_document = documenter(CompleteOutcome)
state_document = documenter(JobState)
schedule_document = documenter(Schedule)
held_job_document = documenter(HeldJob)


# A job just enqueued: what its document holds whatever the request said (the other fields vary).
_NEW_JOB = {"status": "pending", "attempts": 0}
_VARIES = frozenset(
    {"id", "queue", "payload", "priority", "max_attempts", "run_at", "created_at", "idempotency_key", "traceparent"}
    | {"group", "timeout_seconds"}
)


def _new_jobs_texter() -> Callable[[Iterable[Any]], str]:
    """A function that writes the JSON array of these jobs' documents (as orjson writes [job_document(row), ...]),
    each new pending job's straight from its varying fields, the rest of its document being the same text for every
    such job: a batch answers a thousand of them, and its answer costs 0.7 µs a job this way where the documents and
    their encoding cost 1.9 (timeit, 1,000 new jobs; BENCHMARKS.md, "Stop 46"). Any other row (a job an
    idempotency key named, say) gets orjson's text of job_document. Strings and times are written by orjson
    itself, so the text is orjson's byte for byte (tests/unit/test_documents.py compares them)."""
    nones, parts = [], []
    for name in Job.model_fields:
        if name not in JobRow._fields:
            raise ValueError(f"Job.{name} is not a field of JobRow")
        if name in _VARIES:
            if name == "queue":
                parts.append('"queue":{qt if f_queue is lq else (qt := name((lq := f_queue)))}')
            elif name in ("run_at", "created_at"):
                # The same time in a row, as a batch's rows all have: its text at once.
                t, last, f = f"t_{name}", f"l_{name}", f"f_{name}"
                parts.append(f'"{name}":{{{t} if {f} is {last} else ({t} := at(({last} := {f})))}}')
            elif name in ("idempotency_key", "traceparent", "group"):
                parts.append(f'"{name}":{{"null" if f_{name} is None else string(f_{name})}}')
            elif name in ("payload", "timeout_seconds"):  # JSON text, or an integer
                parts.append(f'"{name}":{{"null" if f_{name} is None else f_{name}}}')
            else:  # integers
                parts.append(f'"{name}":{{f_{name}}}')
        else:
            if name not in _NEW_JOB:
                nones.append(f"f_{name}")
            parts.append(orjson.dumps({name: _NEW_JOB.get(name)}).decode()[1:-1])
    checks = [f"f_{name} == {value!r}" for name, value in _NEW_JOB.items()]
    checks.append(f"({', '.join(nones)}) == {(None,) * len(nones)!r}")
    text = ",".join(parts)
    source = (
        "def texts(rows):\n"
        "    names, ats, out = {}, {}, []\n"
        "    lq = l_run_at = l_created_at = qt = t_run_at = t_created_at = object()\n"
        "    def name(q):\n"
        "        if (t := names.get(q)) is None:\n"
        "            t = names[q] = string(q if SEP not in q else logical(q))\n"
        "        return t\n"
        # Keyed with the zone and the fold too: the same instant in two zones, or a wall time in a zone's repeated
        # hour and its other fold, are equal, and their texts are not.
        "    def at(d):\n"
        "        if (t := ats.get(k := (d, d.tzinfo, d.fold))) is None:\n"
        "            t = ats[k] = string(d)\n"
        "        return t\n"
        "    for row in rows:\n"
        f"        {', '.join(f'f_{n}' for n in JobRow._fields)} = row\n"
        f"        if {' and '.join(checks)}:\n"
        f"            out.append(f'{{{{{text}}}}}')\n"
        "        else:\n"
        "            out.append(dumps(document(row)).decode())\n"
        "    return '[' + ','.join(out) + ']'\n"
    )
    scope: dict[str, Any] = {
        "SEP": SEP,
        "logical": logical,
        "string": lambda v: orjson.dumps(v).decode(),
        "dumps": orjson.dumps,
        "document": job_document,
    }
    exec(compile(source, "<documents of new jobs>", "exec"), scope)
    texts: Callable[[Iterable[Any]], str] = scope["texts"]
    return texts


jobs_text = _new_jobs_texter()


def enqueued_document(inserted: Inserted) -> Document:
    """An enqueue's minimal answer (app/models/answers.py EnqueuedJob)."""
    job = inserted.job
    enqueued = "created" if inserted.created else "replaced" if inserted.replaced else "existing"
    return {"id": job.id, "status": job.status, "created": inserted.created, "enqueued": enqueued}


_SUMMARY = tuple(n for n in WorkerSummary.model_fields if n != "state")


def worker_document(row: WorkerRow) -> Document:
    """A worker (app/models/workers.py WorkerSummary)."""
    return {"state": "live" if row.live else "gone", **{n: getattr(row, n) for n in _SUMMARY}}


def _rate(limit: int | None, per_seconds: int | None) -> Document | None:
    return None if limit is None or per_seconds is None else {"limit": limit, "per_seconds": per_seconds}


def config_document(queue: str, row: QueueConfigRow | None) -> Document:
    """GET /queues/{queue}/config (app/models/flow.py QueueConfig); no row: every field is the global one."""

    def get(name: str) -> Any:
        return getattr(row, name) if row is not None else None

    return {
        "queue": queue,
        "max_attempts": get("max_attempts"),
        "backoff_base_seconds": get("backoff_base_seconds"),
        "backoff_max_seconds": get("backoff_max_seconds"),
        "lease_seconds": get("lease_seconds"),
        "default_priority": get("default_priority"),
        "retention": {s: get(f"retention_{s}_seconds") for s in ("completed", "failed", "cancelled")},
        "concurrency": get("concurrency"),
        "rate": _rate(get("rate_limit"), get("rate_per_seconds")),
        "group_concurrency": get("group_concurrency"),
        "group_rate": _rate(get("group_rate_limit"), get("group_rate_per_seconds")),
        "fair": get("fair"),
        "ordered": get("ordered"),
        "max_pending": get("max_pending"),
        "timeout_seconds": get("timeout_seconds"),
        "spread": get("spread") or 1,
        "changed_at": get("changed_at"),
    }


def scale_document(s: Scale) -> Document:
    """GET /queues/{queue}/scale (app/models/operations.py QueueScale)."""
    r = s.row
    rate = None if r.rate_limit is None else {"limit": r.rate_limit, "per_seconds": r.rate_per_seconds}
    return {
        "queue": s.queue,
        "claimable": s.claimable,
        "ready": r.ready,
        "capped": r.capped,
        "running": r.running,
        "oldest_ready_age_seconds": r.oldest_ready_age,
        "paused": r.paused,
        "held_by": s.held_by,
        "limits": {"concurrency": r.concurrency, "rate": rate},
    }
