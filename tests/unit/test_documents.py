"""The documents the API answers with (app/http/documents.py): each has exactly its model's fields, in order, JSON
columns sent as the JSON they hold, and a spread queue's key named by its queue."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from app.db.rows import JobRow
from app.http.documents import JSON_FIELDS, documenter, job_document
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
