"""The documents the API answers with (app/http/documents.py): each has exactly its model's fields, in order, JSON
columns sent as the JSON they hold, and a spread queue's key named by its queue."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import orjson
import pytest
from pydantic import BaseModel

from app.db.rows import JobRow
from app.http.documents import JSON_FIELDS, documenter, job_document, jobs_text
from app.models.answers import Claim, CompleteOutcome, HeartbeatResponse, Job, JobState
from app.models.schedules import Schedule
from app.models.workers import HeldJob

NOW = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


def _job_row(**changes: Any) -> JobRow:
    row = JobRow(
        7, "emails", "running", '{"to": "a@example.com", "n": [1, 2.5, null]}', 3, 1, 5, NOW, NOW, NOW, NOW, None,
        "w-1", None, '"done"', "key-1", "token", None, None, None, "g", '{"pct": 50}', [1, 2], "cancel", 0, 30,
    )  # fmt: skip
    return row._replace(**changes)


def test_a_job_document_has_the_models_fields_in_order_and_the_json_columns_as_json() -> None:
    doc = job_document(_job_row())
    assert list(doc) == list(Job.model_fields)
    sent = orjson.loads(orjson.dumps(doc))
    assert sent["payload"] == {"to": "a@example.com", "n": [1, 2.5, None]}
    assert sent["result"] == "done" and sent["progress"] == {"pct": 50}
    assert sent["unique"] is None and sent["debounce"] is None
    assert sent["id"] == 7 and sent["queue"] == "emails" and sent["depends_on"] == [1, 2]
    Job.model_validate(sent)  # what the published schema says the answer is


def test_a_json_column_not_read_is_null_and_a_spread_key_is_named_by_its_queue() -> None:
    sent = orjson.loads(orjson.dumps(job_document(_job_row(queue="emails#3", payload=None, result=None))))
    assert sent["queue"] == "emails" and sent["payload"] is None and sent["result"] is None


def test_a_unique_or_debounced_jobs_options_go_out_as_json() -> None:
    unique = '{"key": "k", "for_seconds": 60, "while": ["pending"]}'
    debounce = '{"key": "d", "seconds": 5, "max_wait_seconds": 60}'
    sent = orjson.loads(orjson.dumps(job_document(_job_row(unique=unique, debounce=debounce))))
    assert sent["unique"] == orjson.loads(unique) and sent["debounce"] == orjson.loads(debounce)


@pytest.mark.parametrize("model", [Claim, CompleteOutcome, HeartbeatResponse, JobState, Schedule, HeldJob])
def test_every_document_reads_each_field_of_its_model_by_name(model: type[BaseModel]) -> None:
    values = {name: None if name in JSON_FIELDS else f"value of {name}" for name in model.model_fields}
    doc = documenter(model)(SimpleNamespace(**values))
    assert doc == values and list(doc) == list(model.model_fields)
    # A JSON column that holds JSON goes out as that JSON, not as a string of it.
    held = {name: f'{{"{name}": [1, null]}}' if name in JSON_FIELDS else value for name, value in values.items()}
    sent = orjson.loads(orjson.dumps(documenter(model)(SimpleNamespace(**held))))
    assert sent == {name: {name: [1, None]} if name in JSON_FIELDS else value for name, value in values.items()}
    with pytest.raises(AttributeError):
        documenter(model)(SimpleNamespace())


def test_a_field_that_is_not_an_attribute_name_is_refused() -> None:
    for name in ("not a name", "class", "\ufb01eld"):
        odd = type("Odd", (), {"model_fields": {"ok": None, name: None}})
        with pytest.raises(ValueError, match="not an attribute name"):
            documenter(odd)


def _new_row(id_: int, at: datetime, **changes: Any) -> JobRow:
    """A job as a new pending one comes back from the insert (app/db/jobs.py _copy_insert writes it so)."""
    row = JobRow(
        id_, "emails", "pending", '{"to":"a@example.com"}', 0, 0, 3, at, at, None, None, None, None, None, None, None,
        None, None, None, None, None, None, None, None, None, None,
    )  # fmt: skip
    return row._replace(**changes)


def _orjsons(rows: list[JobRow]) -> bytes:
    return orjson.dumps([job_document(r) for r in rows])


_FOLD = datetime(2024, 11, 3, 1, 30, tzinfo=ZoneInfo("America/New_York"))

# Values where a hand-written JSON text and orjson's could part: escapes, non-ASCII, the largest integers,
# times with and without microseconds and in other offsets, a spread queue's key.
_ODD_TEXTS = ["", "plain", 'quote " and \\ back', "tab\tnew\nline\u0000", "é ü 中 😀", "\u2028\u2029", "</script>"]
_TIMES = [
    NOW,
    NOW.replace(microsecond=1),
    NOW.replace(microsecond=999999),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 1, 23, 59, 59, 999999, tzinfo=UTC),
    NOW.astimezone(timezone(timedelta(hours=5, minutes=30))),
    NOW.astimezone(timezone(timedelta(hours=-9, minutes=-45, seconds=-30))),
    # A wall time in a zone's repeated hour, in its two folds: equal, with two texts.
    _FOLD,
    _FOLD.replace(fold=1),
]


def _random_row(rnd: random.Random, id_: int) -> JobRow:
    text = lambda: rnd.choice(_ODD_TEXTS) + rnd.choice(["", str(rnd.random())])  # noqa: E731
    maybe = lambda value: value if rnd.random() < 0.5 else None  # noqa: E731
    shared = rnd.choice(_TIMES)
    row = _new_row(
        id_,
        shared,
        queue=rnd.choice(["emails", "emails#3", "q.a-b_c", "é#12"]),
        payload=rnd.choice(['{"a":1}', "[1,2.5,null]", '"text"', "0", '{"nested":{"k":["é"]}}', None]),
        priority=rnd.choice([0, -100, 100, 2**31 - 1]),
        max_attempts=rnd.choice([1, 3, 1000]),
        run_at=shared if rnd.random() < 0.5 else rnd.choice(_TIMES) + timedelta(seconds=rnd.randint(0, 10**6)),
        created_at=shared if rnd.random() < 0.7 else rnd.choice(_TIMES),
        idempotency_key=maybe(text()),
        traceparent=maybe("00-" + "a" * 32 + "-" + "b" * 16 + "-01"),
        group=maybe(text()),
        timeout_seconds=maybe(rnd.choice([1, 86400])),
        claim_token=maybe("t"),  # never shown
        id=rnd.choice([id_, 2**63 - 1]),
    )
    if rnd.random() < 0.3:  # not a new pending job: one field as a claimed, finished, unique... job has it
        field, value = rnd.choice(
            [
                ("status", "running"),
                ("status", "waiting"),
                ("attempts", 1),
                ("claimed_at", NOW),
                ("lease_expires_at", NOW),
                ("finished_at", NOW),
                ("worker", "w"),
                ("last_error", "boom"),
                ("result", '{"ok":true}'),
                ("schedule", "nightly"),
                ("scheduled_for", NOW),
                ("progress", "50"),
                ("depends_on", [1, 2]),
                ("on_dependency_failure", "cancel"),
                ("pending_dependencies", 0),
                ("unique", '{"key":"k","for_seconds":60,"while":["pending"]}'),
                ("debounce", '{"key":"d","seconds":5,"max_wait_seconds":null}'),
            ]
        )
        row = row._replace(**{field: value})
    return row


def test_the_batchs_text_of_new_jobs_is_orjsons_text_of_their_documents_byte_for_byte() -> None:
    assert jobs_text([]) == "[]"
    # A batch as the COPY makes it: one time object shared by every row, one queue.
    batch = [_new_row(i, NOW, payload=f'{{"n":{i}}}') for i in range(1, 1001)]
    assert jobs_text(batch).encode() == _orjsons(batch)
    # Rows of every kind mixed, new ones among them (the fallback for the others), in many orders.
    rnd = random.Random(22)
    for _ in range(300):
        rows = [_random_row(rnd, i) for i in range(rnd.randint(1, 12))]
        assert jobs_text(rows).encode() == _orjsons(rows), rows


def test_the_batchs_text_shows_each_job_as_its_model_says() -> None:
    rows = [_new_row(1, NOW, queue="emails#2", traceparent="00-x", group="g"), _job_row()]
    sent = orjson.loads(jobs_text(rows))
    assert [list(doc) for doc in sent] == [list(Job.model_fields)] * 2
    assert sent[0]["queue"] == "emails" and sent[0]["group"] == "g" and sent[0]["status"] == "pending"
    assert sent[1]["status"] == "running" and sent[1]["depends_on"] == [1, 2]
    for doc in sent:
        Job.model_validate(doc)
