"""Example documents for the published OpenAPI contract, by schema name (a test validates each against its
schema); the example problems are app/http/problem_examples.py."""

from __future__ import annotations

from typing import Any

from app import __version__

_TOKEN = "q7Hc2dVx9Jm3Kp0LwZtY4s"
_AT = "2026-11-29T12:00:00.125+00:00"
_LATER = "2026-11-29T12:05:00.125+00:00"
_TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

_JOB: dict[str, Any] = {
    "id": 42,
    "queue": "emails",
    "status": "pending",
    "payload": {"to": "ada@example.com", "template": "welcome"},
    "priority": 5,
    "attempts": 0,
    "max_attempts": 5,
    "run_at": _AT,
    "created_at": _AT,
    "claimed_at": None,
    "lease_expires_at": None,
    "finished_at": None,
    "worker": None,
    "last_error": None,
    "result": None,
    "idempotency_key": "welcome-ada",
    "traceparent": _TRACE,
    "schedule": None,
    "scheduled_for": None,
    "group": "customer-1042",
    "progress": None,
    "depends_on": None,
    "on_dependency_failure": None,
    "pending_dependencies": None,
    "timeout_seconds": None,
    "unique": None,
    "debounce": None,
}
# A debounced job: re-index document 9 ten seconds after its last edit, and at most a minute after the first.
_DEBOUNCED = {
    **_JOB,
    "id": 45,
    "queue": "search",
    "payload": {"document": 9, "revision": 4},
    "priority": 0,
    "idempotency_key": None,
    "group": None,
    "run_at": "2026-11-29T12:00:10+00:00",
    "debounce": {
        "key": "reindex-9",
        "seconds": 10,
        "max_wait_seconds": 60,
        "run_by": "2026-11-29T12:01:00+00:00",
    },
}
# A unique job: at most one digest per customer per clock hour while pending, running or completed.
_UNIQUE = {
    **_JOB,
    "id": 44,
    "queue": "digests",
    "payload": {"customer": 1042},
    "priority": 0,
    "idempotency_key": None,
    "unique": {
        "key": "digest-1042",
        "for_seconds": 3600,
        "while": ["pending", "running", "completed"],
        "window_start": "2026-11-29T11:00:00+00:00",
        "window_end": "2026-11-29T12:00:00+00:00",
    },
}
# A job of a workflow: it runs once jobs 40 and 41 have completed; one of them has.
_WAITING = {
    **_JOB,
    "id": 43,
    "queue": "reports",
    "status": "waiting",
    "payload": {"report": "weekly"},
    "priority": 0,
    "idempotency_key": None,
    "group": None,
    "depends_on": [40, 41],
    "on_dependency_failure": "cancel",
    "pending_dependencies": 1,
}
_DONE = {
    **_JOB,
    "status": "completed",
    "attempts": 1,
    "claimed_at": _AT,
    "finished_at": "2026-11-29T12:00:01.5+00:00",
    "worker": "mailer-1",
    "result": {"message_id": "abc"},
}
_CLAIM = {
    "id": 42,
    "queue": "emails",
    "payload": {"to": "ada@example.com", "template": "welcome"},
    "priority": 5,
    "attempts": 1,
    "max_attempts": 5,
    "claim_token": _TOKEN,
    "lease_expires_at": _LATER,
    "run_at": _AT,
    "created_at": _AT,
    "traceparent": _TRACE,
    "group": "customer-1042",
}
_ENQUEUE = {"payload": _JOB["payload"], "priority": 5, "idempotency_key": "welcome-ada"}
_SCHEDULED = {
    **_DONE,
    "id": 77,
    "queue": "reports",
    "payload": {"report": "daily"},
    "priority": 0,
    "idempotency_key": None,
    "result": {"rows": 1520},
    "traceparent": None,
    "schedule": "daily-report",
    "scheduled_for": "2026-11-29T06:00:00+00:00",
}
_SCHEDULE = {
    "name": "daily-report",
    "queue": "reports",
    "cron": "0 7 * * MON-FRI",
    "timezone": "Europe/Paris",
    "payload": {"report": "daily"},
    "priority": None,
    "max_attempts": 3,
    "group": None,
    "missed": "skip",
    "paused": False,
    "next_run_at": "2026-11-30T06:00:00+00:00",
    "last_run_at": "2026-11-27T06:00:00+00:00",
    "created_at": "2026-11-01T09:12:00.5+00:00",
    "updated_at": "2026-11-01T09:12:00.5+00:00",
}

_COUNTS = {
    "ready": 120,
    "scheduled": 8,
    "pending": 128,
    "waiting": 0,
    "running": 16,
    "completed": 48211,
    "failed": 3,
    "cancelled": 0,
}
_HELD = {"concurrency": 120, "rate": 0, "group_concurrency": 14, "group_rate": 0, "ordered": 0}
_RETENTION = {"completed": 3600, "failed": None, "cancelled": None}
_CONFIG = {
    "queue": "emails",
    "max_attempts": 8,
    "backoff_base_seconds": None,
    "backoff_max_seconds": None,
    "lease_seconds": 120,
    "default_priority": None,
    "retention": _RETENTION,
    "concurrency": 50,
    "rate": {"limit": 100, "per_seconds": 60},
    "group_concurrency": 2,
    "group_rate": None,
    "fair": True,
    "ordered": None,
    "max_pending": 100000,
    "timeout_seconds": 600,
    "spread": 1,
    "changed_at": _AT,
}
_GROUPS = [
    {"group": "customer-7", "ready": 20000, "running": 2},
    {"group": "customer-1042", "ready": 100, "running": 2},
]
_DURATION = {"count": 8900, "p50_ms": 180.2, "p95_ms": 1450.0, "max_ms": 9800.5}
_WINDOW = {
    "seconds": 300,
    "enqueued": 9000,
    "claimed": 8950,
    "completed": 8900,
    "completions_per_minute": 1780.0,
    "retries": 40,
    "failures": 1,
    "lease_expired": 2,
    "cancelled": 0,
    "released": 3,
    "empty_claims_with_ready_jobs": 5,
    "held_back": _HELD,
    "duration": _DURATION,
}
_REPLICATION = {
    "mode": "synchronous",
    "standbys": 1,
    "synchronous_standbys": 1,
    "synchronous_standby_names": '"pg-1"',
    "server_synchronous_commit": "on",
    "warning": None,
}
_READ_REPLICA = {"serving": True, "lag_seconds": 0.012, "max_lag_seconds": 5.0, "reason": None}
_HEALTH = {
    "jobs_dead_rows": 1840,
    "oldest_xmin_age_seconds": 0.0,
    "oldest_xmin_age_transactions": 0,
    "replication": _REPLICATION,
    "read_replica": _READ_REPLICA,
}
_SUMMARY = {
    "queue": "emails",
    "paused": False,
    "counts": _COUNTS,
    "oldest_ready_age_seconds": 2.4,
    "counts_estimated": False,
    "counts_counted_at": None,
}
_POINT = {
    "at": "2026-11-29T12:00:00+00:00",
    "enqueued": 1810,
    "completed": 1795,
    "failed": 1,
    "p50_ms": 180.2,
    "p95_ms": 1450.0,
    "ready": 120.0,
    "oldest_ready_age_seconds": 2.4,
}
_IDLE_POINT = {
    "at": "2026-11-29T11:59:00+00:00",
    "enqueued": 0,
    "completed": 0,
    "failed": 0,
    "p50_ms": None,
    "p95_ms": None,
    "ready": None,
    "oldest_ready_age_seconds": None,
}
_SPARKLINE = {
    "queue": "emails",
    "enqueued": [0, 1810],
    "completed": [0, 1795],
    "failed": [0, 1],
    "ready": [None, 120.0],
}
_FAILED = {
    **_DONE,
    "status": "failed",
    "attempts": 5,
    "result": None,
    "last_error": "SMTP 550: no such recipient",
}

# Component schema name -> examples (JSON Schema `examples`; the first also becomes the media type's).
_WORKER = {
    "name": "mailer-1-4242",
    "state": "live",
    "queues": ["emails"],
    "sdk": "jobq-client-python",
    "version": __version__,
    "host": "mailer-1",
    "first_seen": "2026-11-29T08:00:00+00:00",
    "last_seen": _AT,
    "jobs_held": 1,
    "job_ids": [42],
    "lease_expires_at": _LATER,
    "completed_last_hour": 1840,
    "failed_last_hour": 3,
}
_GONE_WORKER = {
    **_WORKER,
    "name": "mailer-2-977",
    "state": "gone",
    "host": "10.0.3.17",
    "jobs_held": 0,
    "job_ids": [],
    "lease_expires_at": None,
    "last_seen": "2026-11-29T11:40:00+00:00",
    "completed_last_hour": 12,
    "failed_last_hour": 0,
}
_HELD_JOB = {
    "id": 42,
    "queue": "emails",
    "attempts": 1,
    "max_attempts": 5,
    "claimed_at": _AT,
    "lease_expires_at": _LATER,
    "progress": {"done": 40, "total": 100},
}

SCHEMAS: dict[str, list[Any]] = {
    "EnqueueRequest": [
        _ENQUEUE,
        {"payload": {"report": "daily"}, "run_at": "2026-11-30T06:00:00+00:00", "max_attempts": 3},
        {"payload": [1, 2, 3], "delay_seconds": 60},
        # Runs once jobs 40 and 41 have completed; runs anyway if one of them fails.
        {"payload": {"report": "weekly"}, "depends_on": [40, 41], "on_dependency_failure": "run"},
        # At most one digest per customer per clock hour (a repeat answers 200 with the hour's job).
        {"payload": {"customer": 1042}, "unique": {"key": "digest-1042", "for_seconds": 3600}},
        # One sync at a time: a repeat while one is pending or running returns it; once it finished, a new one.
        {"payload": {"account": 7}, "unique": {"while": ["pending", "running"]}},
        # Re-index 10 s after the last edit, but at least once a minute while edits keep coming.
        {
            "payload": {"document": 9, "revision": 4},
            "debounce": {"key": "reindex-9", "seconds": 10, "max_wait_seconds": 60},
        },
    ],
    "EnqueueBatchRequest": [
        {"jobs": [{"payload": {"n": 1}}, {"payload": {"n": 2}, "priority": 10}]},
        {"jobs": [{"payload": {"n": 1}, "group": "customer-7"}, {"payload": {"n": 2}, "group": "customer-1042"}]},
        # A whole graph at once: fetch, then two transforms, then a load after both (items name earlier ones).
        {
            "jobs": [
                {"payload": {"step": "fetch"}, "ref": "fetch"},
                {"payload": {"step": "resize"}, "ref": "resize", "depends_on": ["fetch"]},
                {"payload": {"step": "index"}, "ref": "index", "depends_on": [{"ref": 0}]},
                {"payload": {"step": "publish"}, "depends_on": ["resize", "index"]},
            ]
        },
    ],
    "ClaimRequest": [
        {"worker": "mailer-1", "limit": 10, "lease_seconds": 300, "wait_seconds": 20},
        # One request per job: the results of the jobs just finished ride on the next claim.
        {"worker": "mailer-1", "wait_seconds": 20, "complete": [{"id": 41, "claim_token": _TOKEN, "result": "sent"}]},
    ],
    "HeartbeatRequest": [
        {"claim_token": _TOKEN},
        {"claim_token": _TOKEN, "lease_seconds": 600},
        {"claim_token": _TOKEN, "progress": {"sent": 40, "total": 100}},
    ],
    "CompleteRequest": [{"claim_token": _TOKEN, "result": {"message_id": "abc"}}],
    "FailRequest": [
        {"claim_token": _TOKEN, "error": "SMTP 451: try again later", "retry_in_seconds": 30},
        {"claim_token": _TOKEN, "error": "no such recipient", "retry": False},
    ],
    "ReleaseRequest": [{"claim_token": _TOKEN}, {"claim_token": _TOKEN, "delay_seconds": 60}],
    "CompleteBatchRequest": [
        {"jobs": [{"id": 42, "claim_token": _TOKEN, "result": "sent"}, {"id": 43, "claim_token": _TOKEN}]}
    ],
    "Job": [_JOB, _DONE, _SCHEDULED, _WAITING, _UNIQUE, _DEBOUNCED],
    "EnqueuedJobs": [
        {
            "jobs": [_JOB, {**_JOB, "id": 43, "priority": 0, "idempotency_key": None}],
            "enqueued": ["created", "created"],
        },
        {"jobs": [_UNIQUE, _UNIQUE], "enqueued": ["existing", "existing"]},
        {"jobs": [_DEBOUNCED], "enqueued": ["replaced"]},
    ],
    "JobList": [{"jobs": [_JOB, {**_JOB, "id": 43, "priority": 0, "idempotency_key": None}]}],
    "EnqueuedJob": [
        {"id": 42, "status": "pending", "created": True, "enqueued": "created"},
        {"id": 42, "status": "pending", "created": False, "enqueued": "existing"},
        {"id": 42, "status": "pending", "created": False, "enqueued": "replaced"},
    ],
    "MinimalEnqueuedJobs": [
        {
            "jobs": [
                {"id": 42, "status": "pending", "created": True, "enqueued": "created"},
                {"id": 43, "status": "pending", "created": True, "enqueued": "created"},
            ]
        }
    ],
    "JobState": [{"id": 42, "status": "completed"}, {"id": 42, "status": "pending"}],
    "Claim": [_CLAIM],
    "ClaimResponse": [
        {"jobs": [_CLAIM], "completed": []},
        {"jobs": [], "completed": []},
        {"jobs": [_CLAIM], "completed": [{"id": 41, "outcome": "completed", "status": "completed"}]},
    ],
    "HeartbeatResponse": [
        {"id": 42, "lease_expires_at": _LATER, "cancel_requested": False},
        {"id": 42, "lease_expires_at": None, "cancel_requested": True},
    ],
    "CompleteOutcome": [{"id": 42, "outcome": "completed", "status": "completed"}],
    "CompleteBatchResponse": [
        {
            "results": [
                {"id": 42, "outcome": "completed", "status": "completed"},
                {"id": 43, "outcome": "claim_lost", "status": "pending"},
                {"id": 44, "outcome": "not_found", "status": None},
                {"id": 45, "outcome": "cancelled", "status": "cancelled"},
            ]
        }
    ],
    "Health": [{"status": "ok", "version": __version__}],
    "Readiness": [
        {
            "status": "ready",
            "replication": {"mode": "synchronous", "standbys": 1, "synchronous_standbys": 1, "warning": None},
            "read_replica": None,
        }
    ],
    # operators
    "QueueCounts": [_COUNTS],
    "DurationStats": [_DURATION, {"count": 0, "p50_ms": None, "p95_ms": None, "max_ms": None}],
    "WindowStats": [_WINDOW],
    "QueueStats": [
        {
            "queue": "emails",
            "paused": False,
            "counts": _COUNTS,
            "oldest_ready_age_seconds": 2.4,
            "counts_estimated": False,
            "counts_counted_at": None,
            "jobs_on_last_attempt": 1,
            "jobs_one_attempt_left": 2,
            "window": _WINDOW,
            "database": _HEALTH,
            "as_of": _AT,
            "config": _CONFIG,
            "groups": _GROUPS,
            "groups_estimated": False,
            "groups_counted_at": None,
        }
    ],
    "DatabaseHealth": [_HEALTH],
    "HeldBack": [_HELD],
    "GroupStats": _GROUPS,
    "QueueConfig": [_CONFIG],
    "QueueConfigPatch": [
        {"concurrency": 50, "rate": {"limit": 100, "per_seconds": 60}},
        {"group_concurrency": 2, "fair": True, "retention": {"completed": 3600}},
        {"concurrency": None, "max_attempts": 8},
        {"spread": 8},
    ],
    "Rate": [{"limit": 100, "per_seconds": 60}],
    "RateLimit": [{"limit": 100, "per_seconds": 60}],
    "RetentionPatch": [{"completed": 3600, "failed": None}],
    "Retention": [_RETENTION],
    "QueueSummary": [_SUMMARY],
    "QueueList": [
        {"queues": [_SUMMARY, {**_SUMMARY, "queue": "reports", "paused": True}], "next_cursor": None},
        {"queues": [_SUMMARY], "next_cursor": "eyJzIjoicXVldWVzIiwiayI6WyJlbWFpbHMiXX0"},
    ],
    "JobPage": [
        {"jobs": [_JOB], "next_cursor": "eyJzIjoicGVuZGluZyIsImsiOls1LCIyMDI2In0"},
        {"jobs": [], "next_cursor": None},
    ],
    "CancelRequest": [{"reason": "customer unsubscribed"}],
    "RedriveRequest": [{"error_contains": "SMTP 451", "dry_run": True}, {"limit": 1000}],
    "RedriveResult": [{"queue": "emails", "dry_run": True, "jobs": 17}],
    "QueueState": [{"queue": "emails", "paused": True}],
    # history
    "SeriesPoint": [_POINT, _IDLE_POINT],
    "Series": [
        {
            "queue": "emails",
            "range": "hour",
            "bucket_seconds": 60,
            "since": "2026-11-29T11:01:00+00:00",
            "as_of": _AT,
            "points": [_IDLE_POINT, _POINT],
        }
    ],
    "QueueSparkline": [_SPARKLINE],
    "Sparklines": [
        {
            "range": "hour",
            "bucket_seconds": 60,
            "since": "2026-11-29T11:01:00+00:00",
            "as_of": _AT,
            "queues": [_SPARKLINE],
            "next_cursor": None,
        }
    ],
    # search and bulk actions
    "JobFilter": [{"queue": "emails", "status": "failed", "payload_contains": {"to": "ada@example.com"}}],
    "SearchRequest": [
        {"queue": "emails", "status": "failed", "payload_contains": {"to": "ada@example.com"}},
        {"idempotency_key": "welcome-ada"},
        {"error_contains": "SMTP 451", "limit": 20},
    ],
    "SearchResult": [
        {"jobs": [_FAILED], "next_cursor": None, "examined": 1, "partial": False},
        {"jobs": [], "next_cursor": "eyJzIjpudWxsLCJrIjpbMzEwMDBdfQ", "examined": 10000, "partial": True},
    ],
    "BulkRequest": [
        {"action": "retry", "ids": [42, 43, 44], "dry_run": True},
        {
            "action": "cancel",
            "filter": {"queue": "emails", "status": "pending", "payload_contains": {"batch": 7}},
            "reason": "batch 7 withdrawn",
        },
    ],
    "BulkOutcome": [{"id": 42, "outcome": "done", "status": "pending"}],
    "BulkResult": [
        {
            "action": "retry",
            "dry_run": False,
            "jobs": [
                {"id": 42, "outcome": "done", "status": "pending"},
                {"id": 43, "outcome": "skipped", "status": "running"},
                {"id": 44, "outcome": "not_found", "status": None},
            ],
            "done": 1,
            "skipped": 1,
            "not_found": 1,
            "next_cursor": None,
            "partial": False,
        }
    ],
    # explain
    "PausedReason": [{"kind": "paused"}],
    "ScheduledReason": [{"kind": "scheduled", "run_at": _LATER}],
    "BackoffReason": [{"kind": "backoff", "run_at": _LATER, "attempts": 2, "last_error": "SMTP 451 greylisted"}],
    "ConcurrencyReason": [{"kind": "concurrency", "limit": 2, "held_by": [40, 41]}],
    "RateReason": [{"kind": "rate", "limit": 100, "per_seconds": 60, "until": _LATER}],
    "GroupConcurrencyReason": [{"kind": "group_concurrency", "group": "customer-1042", "limit": 1, "held_by": [39]}],
    "GroupRateReason": [
        {"kind": "group_rate", "group": "customer-1042", "limit": 5, "per_seconds": 60, "until": _LATER}
    ],
    "OrderedReason": [{"kind": "ordered", "group": "customer-1042", "behind": 38}],
    "DependenciesReason": [{"kind": "dependencies", "waiting_for": [41]}],
    "RunningReason": [{"kind": "running", "worker": "mailer-1-4242", "lease_expires_at": _LATER}],
    "FinishedReason": [{"kind": "finished", "status": "completed"}],
    "JobExplanation": [
        {
            "id": 42,
            "queue": "emails",
            "status": "pending",
            "runnable": False,
            "reasons": [
                {"kind": "concurrency", "limit": 2, "held_by": [40, 41]},
                {"kind": "group_concurrency", "group": "customer-1042", "limit": 1, "held_by": [40]},
            ],
        },
        {"id": 43, "queue": "emails", "status": "pending", "runnable": True, "reasons": []},
    ],
    # scaling signals
    "ScaleLimits": [{"concurrency": 20, "rate": None}],
    "QueueScale": [
        {
            "queue": "emails",
            "claimable": 12,
            "ready": 412,
            "capped": False,
            "running": 8,
            "oldest_ready_age_seconds": 3.2,
            "paused": False,
            "held_by": ["concurrency"],
            "limits": {"concurrency": 20, "rate": None},
        }
    ],
    # workers
    "WorkerSummary": [_WORKER, _GONE_WORKER],
    "WorkerList": [{"workers": [_WORKER, _GONE_WORKER]}],
    "HeldJob": [_HELD_JOB],
    "WorkerDetail": [{**_WORKER, "jobs": [_HELD_JOB]}],
    # schedules
    "ScheduleRequest": [
        {"queue": "reports", "cron": "0 7 * * MON-FRI", "timezone": "Europe/Paris", "payload": {"report": "daily"}},
        {"queue": "metrics", "cron": "*/10 * * * * *", "payload": None, "missed": "catch_up", "max_attempts": 1},
    ],
    "Schedule": [_SCHEDULE, {**_SCHEDULE, "paused": True, "next_run_at": None}],
    "ScheduleList": [{"schedules": [_SCHEDULE]}],
}

METRICS_EXAMPLE = """# HELP jobq_jobs_completed_total Jobs completed.
# TYPE jobq_jobs_completed_total counter
jobq_jobs_completed_total{queue="emails"} 48211.0
"""
