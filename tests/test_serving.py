"""The process as it serves: the garbage collector set for serving while the application runs (app/main.py)."""

from __future__ import annotations

import gc

from app.main import GC_THRESHOLD0, _collector_for_serving
from tests.support import LiveServer


def test_a_serving_application_freezes_what_it_started_with_and_collects_less_often(server_factory) -> None:  # type: ignore[no-untyped-def]
    """While it serves, the objects alive at start-up are out of the collector's walks, and the youngest generation
    waits for GC_THRESHOLD0 new objects: a full collection walked about 80,000 objects every few hundred requests
    (BENCHMARKS.md, "The garbage collector")."""
    server: LiveServer = server_factory()  # its own start-up: another test may have given the collector back
    assert server.client.get("/healthz").status_code == 200
    assert gc.get_freeze_count() > 10_000
    assert gc.get_threshold()[0] >= GC_THRESHOLD0


def test_the_collector_is_given_back_as_it_was_when_the_application_stops() -> None:
    """Another application started in the same process (tests, an embedding) finds the collector as it left it; a
    threshold an embedding application raised above ours is kept, and one changed while the application ran is left
    as it was changed."""
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with _collector_for_serving():
            assert gc.get_threshold() == (GC_THRESHOLD0, 10, 10)
            assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == 0

        with _collector_for_serving():
            gc.set_threshold(3000, 10, 10)  # changed by someone else while the application ran: left as they set it
        assert gc.get_threshold() == (3000, 10, 10)

        gc.set_threshold(5 * GC_THRESHOLD0, 20, 20)
        with _collector_for_serving():
            assert gc.get_threshold() == (5 * GC_THRESHOLD0, 20, 20)
        assert gc.get_threshold() == (5 * GC_THRESHOLD0, 20, 20)
    finally:
        gc.set_threshold(*before)
