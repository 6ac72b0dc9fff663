"""The one place where rows become HTTP documents: each document has exactly the fields of its response
model (app/models/), read by name from the row, so the published schema and the answers cannot drift.
JSON columns arrive as text and go out as JSON fragments, never parsed and serialised again."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from orjson import Fragment
from pydantic import BaseModel

from app.models.jobs import Claim, CompleteOutcome, HeartbeatResponse, Job
from app.models.schedules import Schedule

JSON_FIELDS = frozenset({"payload", "result"})

Document = dict[str, Any]


def documenter(model: type[BaseModel]) -> Callable[[Any], Document]:
    """A function that turns an object with the model's fields as attributes into the model's document."""
    names = tuple(model.model_fields)
    values = operator.attrgetter(*names)
    as_json = [i for i, name in enumerate(names) if name in JSON_FIELDS]

    def document(row: Any) -> Document:
        found = list(values(row))
        for i in as_json:
            if found[i] is not None:
                found[i] = Fragment(found[i])
        return dict(zip(names, found, strict=True))

    return document


job_document = documenter(Job)
claim_document = documenter(Claim)
renewal_document = documenter(HeartbeatResponse)
outcome_document = documenter(CompleteOutcome)
schedule_document = documenter(Schedule)
