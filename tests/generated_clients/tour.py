"""The README's API tour through the Python client that openapi-python-client generates from
openapi/openapi.json (the package jobq_generated, beside this file when the test runs). Type-checked with
mypy --strict, then run against a live jobq:  python tour.py BASE_URL API_KEY"""

from __future__ import annotations

import sys
from typing import TypeVar

from jobq_generated.api.operators import get_job, list_jobs
from jobq_generated.api.producers import enqueue_job, enqueue_jobs
from jobq_generated.api.workers import (
    claim_jobs,
    complete_job,
    complete_jobs,
    fail_job,
    heartbeat_job,
    release_job,
)
from jobq_generated.client import AuthenticatedClient
from jobq_generated.models import (
    ClaimRequest,
    CompleteBatchRequest,
    CompleteItem,
    CompleteOutcomeOutcome,
    CompleteRequest,
    EnqueueBatchRequest,
    EnqueueRequest,
    FailRequest,
    HeartbeatRequest,
    Problem,
    ReleaseRequest,
    Status,
)
from jobq_generated.types import Response

T = TypeVar("T")


def ok(answer: Response[T | Problem], status: int = 200) -> T:
    """The parsed answer of a success, which must not be a Problem."""
    assert answer.status_code == status, (answer.status_code, answer.content)
    assert answer.parsed is not None and not isinstance(answer.parsed, Problem), answer.content
    return answer.parsed


def problem(answer: Response[T | Problem], status: int) -> Problem:
    assert answer.status_code == status, (answer.status_code, answer.content)
    assert isinstance(answer.parsed, Problem), answer.content
    return answer.parsed


def main(base: str, key: str) -> None:
    jobq = AuthenticatedClient(base_url=base, token=key, raise_on_unexpected_status=True)
    with jobq:
        # enqueue: 201 with the job; a repeated idempotency key returns the existing job with 200
        new = EnqueueRequest(payload={"to": "ada@example.com"}, priority=5, idempotency_key="welcome-ada")
        ada = ok(enqueue_job.sync_detailed("emails", client=jobq, body=new), 201)
        assert ada.status is Status.PENDING and ada.result is None and ada.payload == {"to": "ada@example.com"}
        assert ok(enqueue_job.sync_detailed("emails", client=jobq, body=new)).id == ada.id

        # later, or in a batch (all or nothing)
        later = ok(
            enqueue_job.sync_detailed(
                "emails", client=jobq, body=EnqueueRequest(payload={"to": "bob@example.com"}, delay_seconds=60)
            ),
            201,
        )
        assert later.run_at > later.created_at
        batch = EnqueueBatchRequest(jobs=[EnqueueRequest(payload=n) for n in (1, 2, 3)])
        assert len(ok(enqueue_jobs.sync_detailed("emails", client=jobq, body=batch), 201).jobs) == 3

        # a worker claims up to 10 jobs with a 5-minute lease (the delayed job is not due)
        claim = ClaimRequest(worker="mailer-1", limit=10, lease_seconds=300)
        a, b, c, d = ok(claim_jobs.sync_detailed("emails", client=jobq, body=claim)).jobs
        assert a.id == ada.id and a.attempts == 1 and a.claim_token

        # still working: extend the lease
        beat = ok(heartbeat_job.sync_detailed(a.id, client=jobq, body=HeartbeatRequest(claim_token=a.claim_token)))
        assert beat.id == a.id and beat.cancel_requested is False and beat.lease_expires_at is not None

        # done; the same complete again is a success that keeps the first result
        done = CompleteRequest(claim_token=a.claim_token, result={"message_id": "abc"})
        assert ok(complete_job.sync_detailed(a.id, client=jobq, body=done)).status is Status.COMPLETED
        repeat = CompleteRequest(claim_token=a.claim_token, result="other")
        assert ok(complete_job.sync_detailed(a.id, client=jobq, body=repeat)).result == {"message_id": "abc"}

        # or failed: retried later
        fail = FailRequest(claim_token=b.claim_token, error="SMTP 451", retry_in_seconds=30)
        failed = ok(fail_job.sync_detailed(b.id, client=jobq, body=fail))
        assert failed.status is Status.PENDING and failed.last_error == "SMTP 451"

        # or handed back untried: pending again, the attempt not counted
        released = ok(release_job.sync_detailed(d.id, client=jobq, body=ReleaseRequest(claim_token=d.claim_token)))
        assert released.status is Status.PENDING and released.attempts == 0

        # many at once, each with its own outcome
        items = [
            CompleteItem(id=c.id, claim_token=c.claim_token, result="sent"),
            CompleteItem(id=b.id, claim_token=b.claim_token),
        ]
        outcomes = ok(complete_jobs.sync_detailed(client=jobq, body=CompleteBatchRequest(jobs=items))).results
        assert [o.outcome for o in outcomes] == [CompleteOutcomeOutcome.COMPLETED, CompleteOutcomeOutcome.CLAIM_LOST]

        # a stale token and a bad request: typed problems
        stale = heartbeat_job.sync_detailed(b.id, client=jobq, body=HeartbeatRequest(claim_token=b.claim_token))
        assert problem(stale, 409).type_ == "urn:jobq:problem:claim-lost"
        refused = problem(claim_jobs.sync_detailed("emails", client=jobq, body=ClaimRequest(worker="w", limit=0)), 422)
        assert refused.errors and refused.errors[0].loc == ["body", "limit"] and refused.errors[0].msg

        # inspect a job (never shows the claim token)
        got = ok(get_job.sync_detailed(a.id, client=jobq))
        assert got.status is Status.COMPLETED and "claim_token" not in got.additional_properties
        page = ok(list_jobs.sync_detailed("emails", client=jobq, status=Status.PENDING, limit=10))
        assert len(page.jobs) == 3 and page.next_cursor is None
    print("tour ok")


if __name__ == "__main__":
    main(*sys.argv[1:3])
