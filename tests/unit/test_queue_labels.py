"""The bound on /metrics' `queue` label (app/observability/metrics.py QueueLabels)."""

from __future__ import annotations

from app.observability.metrics import OTHER_QUEUE, QueueLabels


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


def test_folded_depths_are_summed_and_go_back_to_zero() -> None:
    from app.observability.metrics import Metrics

    metrics = Metrics(max_queues=1)
    metrics.set_depths([("a", 1, 0, 2.0, 0), ("b", 3, 1, 5.0, 0), ("c", 4, 0, 1.0, 0)])
    assert metrics.registry.get_sample_value("jobq_queue_ready_jobs", {"queue": OTHER_QUEUE}) == 7
    assert metrics.registry.get_sample_value("jobq_queue_oldest_ready_age_seconds", {"queue": OTHER_QUEUE}) == 5.0
    metrics.set_depths([("a", 0, 0, 0.0, 0), ("b", 0, 0, 0.0, 0), ("c", 0, 0, 0.0, 0)])
    assert metrics.registry.get_sample_value("jobq_queue_ready_jobs", {"queue": OTHER_QUEUE}) == 0
    assert metrics.registry.get_sample_value("jobq_queue_ready_jobs", {"queue": "a"}) == 0
