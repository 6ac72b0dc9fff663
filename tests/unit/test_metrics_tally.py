"""The hot paths' Prometheus counts, tallied in plain numbers and applied in one go (app/observability/metrics.py
Tally): what /metrics shows must be exactly what prometheus_client's own inc() and observe() would have made."""

from __future__ import annotations

import math
import sys
import threading

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from app.observability.metrics import DURATION_BOUNDS_MS, HTTP_BUCKETS, Metrics, Tally

# On a bound, just either side of one, below the first, past the last, zero, negative, fractions.
AMOUNTS = [0.0, -0.5, 0.001, 0.0010001, 0.00099, 0.0025, 0.003, 0.1, 0.25, 29.9, 30.0, 30.5, 1e9, 0.00733, 2.5]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_tallied_histogram_and_counter_read_as_prometheus_own() -> None:
    direct, tallied = CollectorRegistry(), CollectorRegistry()
    tally = Tally()
    made = {}
    for name, registry in (("direct", direct), ("tallied", tallied)):
        h = Histogram("req_seconds", "h", ["route"], buckets=HTTP_BUCKETS, registry=registry)
        c = Counter("jobs_total", "c", ["queue"], registry=registry)
        made[name] = (h, c)
    for i, amount in enumerate(AMOUNTS):
        route = "a" if i % 3 else "b"
        made["direct"][0].labels(route).observe(amount)
        tally.observe(made["tallied"][0].labels(route), amount)
        made["direct"][1].labels(route).inc(i)
        tally.inc(made["tallied"][1].labels(route), i)
    assert _samples(tallied) != _samples(direct)  # nothing applied yet
    tally.apply()
    assert _samples(tallied) == _samples(direct)
    tally.apply()  # applying twice adds nothing
    assert _samples(tallied) == _samples(direct)


def test_the_registry_applies_before_it_is_read() -> None:
    """The exposition and get_sample_value read the tally's counts at once, without waiting for a tick."""
    metrics = Metrics()
    metrics.count("enqueued", "q", 3)
    metrics.count("enqueued", "q")
    metrics.completed("q", [4.0, 5.0, 7000.0])
    assert metrics.registry.get_sample_value("jobq_jobs_enqueued_total", {"queue": "q"}) == 4
    assert metrics.registry.get_sample_value("jobq_jobs_completed_total", {"queue": "q"}) == 3
    assert metrics.registry.get_sample_value("jobq_job_duration_seconds_count", {"queue": "q"}) == 3
    assert math.isclose(metrics.registry.get_sample_value("jobq_job_duration_seconds_sum", {"queue": "q"}), 7.009)
    # 4 ms and 5 ms are in the 5 ms bucket (bounds are inclusive), 7 s only from the 10 s bucket up.
    assert DURATION_BOUNDS_MS[0] == 5
    assert metrics.registry.get_sample_value("jobq_job_duration_seconds_bucket", {"queue": "q", "le": "0.005"}) == 2
    assert metrics.registry.get_sample_value("jobq_job_duration_seconds_bucket", {"queue": "q", "le": "5.0"}) == 2
    assert metrics.registry.get_sample_value("jobq_job_duration_seconds_bucket", {"queue": "q", "le": "10.0"}) == 3
    text = generate_latest(metrics.exposition_registry()).decode()
    assert 'jobq_jobs_enqueued_total{queue="q"} 4.0' in text
    metrics.count("enqueued", "q", 2)
    assert 'jobq_jobs_enqueued_total{queue="q"} 6.0' in generate_latest(metrics.exposition_registry()).decode()


def test_a_registry_read_from_another_thread_loses_and_doubles_nothing() -> None:
    """The event loop counts while a registry is read (and so applied) from another thread (the tests' client
    thread, an embedding application): every event is counted exactly once."""
    metrics = Metrics()
    n = 100_000
    done = threading.Event()

    def count() -> None:
        for _ in range(n):
            metrics.count("enqueued", "q")
            metrics.completed("q", [1.0])
        done.set()

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter will
    try:
        counter = threading.Thread(target=count)
        counter.start()
        reads = 0
        while not done.is_set():
            metrics.registry.get_sample_value("jobq_jobs_enqueued_total", {"queue": "q"})
            reads += 1
        counter.join()
    finally:
        sys.setswitchinterval(before)
    assert reads > 0
    assert metrics.registry.get_sample_value("jobq_jobs_enqueued_total", {"queue": "q"}) == n
    assert metrics.registry.get_sample_value("jobq_jobs_completed_total", {"queue": "q"}) == n
    assert metrics.registry.get_sample_value("jobq_job_duration_seconds_count", {"queue": "q"}) == n
    assert metrics.registry.get_sample_value("jobq_job_duration_seconds_bucket", {"queue": "q", "le": "0.005"}) == n
