"""The bound on /metrics' `queue` label (app/runtime/metrics.py QueueLabels)."""

from __future__ import annotations

from app.runtime.metrics import OTHER_QUEUE, QueueLabels


def test_past_the_cap_queues_fold_into_other() -> None:
    labels = QueueLabels(max_queues=2, idle_seconds=3600)
    assert [labels.label(q) for q in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER_QUEUE, "a", OTHER_QUEUE]
    assert labels.has("a") and not labels.has("c")


def test_idle_queues_give_their_place_back() -> None:
    labels = QueueLabels(max_queues=1, idle_seconds=0)
    assert labels.label("a") == "a"
    assert labels.label("b") == OTHER_QUEUE
    assert labels.idle() == ["a"]
    assert labels.label("b") == "b"
