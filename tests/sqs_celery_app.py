"""A Celery app on kombu's SQS transport pointed at jobq (tests/test_sqs_celery.py runs its worker): the broker is
jobq's SQS endpoint, signed with the pair in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. Each task writes what it
did to a file in CELERY_RESULTS, the test's record of work done (no result backend: the broker is the subject)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from celery import Celery

QUEUE = "celery-jobs"
_url = urlsplit(os.environ["JOBQ_URL"])
_pair = f"{quote(os.environ['AWS_ACCESS_KEY_ID'], safe='')}:{quote(os.environ['AWS_SECRET_ACCESS_KEY'], safe='')}"

app = Celery("jobq_sqs", broker=f"sqs://{_pair}@{_url.hostname}:{_url.port}")
app.conf.update(
    broker_transport_options={
        "region": "eu-west-1",
        "is_secure": False,  # plain http to the test server
        "wait_time_seconds": 2,  # long-polls of ReceiveMessage
        "polling_interval": 0.1,
        "visibility_timeout": 60,
    },
    task_default_queue=QUEUE,
    task_acks_late=True,  # DeleteMessage (jobq: complete) once the task has run
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


def _record(name: str, text: str) -> None:
    # Written whole, then renamed into place: the test looks for the file's name while the worker runs, and
    # must never read one created but not yet written.
    final = Path(os.environ["CELERY_RESULTS"], name)
    partial = final.with_name(f".{name}.partial")
    partial.write_text(text)
    partial.replace(final)


@app.task(name="add")
def add(x: int, y: int, tag: str) -> int:
    _record(tag, str(x + y))
    return x + y


@app.task(name="flaky", bind=True, max_retries=3)
def flaky(self: Any, tag: str) -> str:
    """Fails on its first run, then succeeds: Celery's retry is a new message, sent with a delay."""
    if self.request.retries == 0:
        raise self.retry(countdown=1)
    _record(tag, f"retries={self.request.retries}")
    return tag
