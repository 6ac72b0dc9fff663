"""Queue configuration without a server: what a PATCH changes, the rules across fields, the CLI's --set."""

from __future__ import annotations

import pytest

from app.core.flow import changes_of, check, effective
from app.db.flow import CONFIG_FIELDS, QueueConfigRow
from app.errors import ValidationFailed
from app.models.flow import QueueConfigPatch
from app.runtime.cli.queues import patch_of
from app.settings import Settings

S = Settings.defaults()


def row(**values: object) -> QueueConfigRow:
    fields = {**dict.fromkeys(CONFIG_FIELDS), "spread": 1, "keys_used": 1}
    fields.update(values)
    return QueueConfigRow(queue="q", **fields, limited=False, grouped=False, changed_at=None)  # type: ignore[arg-type]


def test_a_patch_changes_the_fields_it_names_and_null_clears() -> None:
    patch = QueueConfigPatch.model_validate(
        {"concurrency": 3, "rate": None, "retention": {"failed": 60}, "group_rate": {"limit": 2, "per_seconds": 9}}
    )
    assert changes_of(patch) == {
        "concurrency": 3,
        "rate_limit": None,
        "rate_per_seconds": None,
        "retention_failed_seconds": 60,
        "group_rate_limit": 2,
        "group_rate_per_seconds": 9,
    }
    cleared = changes_of(QueueConfigPatch.model_validate({"retention": None}))
    assert cleared == {f"retention_{s}_seconds": None for s in ("completed", "failed", "cancelled")}
    assert changes_of(QueueConfigPatch.model_validate({})) == {}


@pytest.mark.parametrize(
    "values",
    [
        {"ordered": True, "group_concurrency": 2},
        {"backoff_base_seconds": 5000.0},  # above the global cap (3600 s)
        {"backoff_max_seconds": 0.5},  # below the global base (1 s)
        {"lease_seconds": S.lease_max_seconds + 1},
        # A spread queue (app/db/spread.py) refuses what must be counted or ordered in one statement.
        {"spread": 2, "concurrency": 1},
        {"spread": 64, "rate_limit": 5, "rate_per_seconds": 1},
        {"spread": 2, "group_concurrency": 3},
        {"spread": 2, "group_rate_limit": 5, "group_rate_per_seconds": 1},
        {"spread": 2, "fair": True},
        {"spread": 2, "ordered": True},
    ],
)
def test_rules_across_fields_are_checked_on_the_result(values: dict[str, object]) -> None:
    with pytest.raises(ValidationFailed):
        check(S, values)


def test_valid_combinations_pass() -> None:
    check(S, {"ordered": True, "group_concurrency": 1})
    check(S, {"ordered": True})
    check(S, {"backoff_base_seconds": 10.0, "backoff_max_seconds": 10.0})
    check(S, {"spread": 64, "fair": False, "max_pending": 10, "timeout_seconds": 5, "max_attempts": 3})
    check(S, {"spread": 1, "concurrency": 2, "fair": True})


def test_effective_settings_fall_back_to_the_global_ones() -> None:
    plain = effective(S, None)
    assert (plain.max_attempts, plain.lease_seconds, plain.default_priority) == (5, 30, 0)
    assert plain.retention["completed"] == S.retention_completed_seconds and not plain.limited
    mine = effective(S, row(max_attempts=2, default_priority=-3, retention_failed_seconds=0))
    assert (mine.max_attempts, mine.default_priority, mine.retention["failed"]) == (2, -3, 0)
    assert (plain.spread, plain.keys, mine.spread, mine.keys) == (1, (), 1, ("q",))
    # Spread lowered from 3 to 2: enqueues use two keys, claims take from all three.
    lowered = effective(S, row(spread=2, keys_used=3))
    assert (lowered.spread, lowered.keys) == (2, ("q", "q#1", "q#2"))


def test_the_command_line_names_fields_as_the_api_does() -> None:
    body = patch_of(["concurrency=5", "rate=100/60", "fair=true", "retention.completed=3600", "max_attempts=null"])
    assert body == {
        "concurrency": 5,
        "rate": {"limit": 100, "per_seconds": 60},
        "fair": True,
        "retention": {"completed": 3600},
        "max_attempts": None,
    }
    with pytest.raises(ValueError):
        patch_of(["concurrency"])
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        QueueConfigPatch.model_validate(patch_of(["fair=maybe"]))
