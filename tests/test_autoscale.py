"""Scaling signals: GET /queues/{queue}/scale (how many more claims could be served now under the queue's
limits), the same figures as Prometheus gauges, and docs/autoscaling.md's KEDA examples."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import yaml

from app.models.operations import QueueScale
from tests.support import LiveServer, problem
from tests.test_security import ENV_KEY, as_key, create_key

DOC = Path(__file__).parent.parent / "docs" / "autoscaling.md"
LATER = (datetime.now(UTC) + timedelta(days=1)).isoformat()


def scale(server: LiveServer, queue: str = "q", **params: Any) -> dict[str, Any]:
    r = server.client.get(f"/queues/{queue}/scale", params=params)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def configure(server: LiveServer, queue: str = "q", **config: Any) -> None:
    r = server.client.patch(f"/queues/{queue}/config", json=config)
    assert r.status_code == 200, r.text


def claimed(server: LiveServer, queue: str = "q", limit: int = 100) -> list[dict[str, Any]]:
    return server.claim(queue, limit=limit)


def test_a_queue_without_limits_can_take_every_ready_job(server: LiveServer) -> None:
    assert scale(server) == {
        "queue": "q", "claimable": 0, "ready": 0, "capped": False, "running": 0, "oldest_ready_age_seconds": None,
        "paused": False, "held_by": [], "limits": {"concurrency": None, "rate": None},
    }  # fmt: skip
    for priority in (0, 5, 0, 5, 9):
        server.enqueue(priority=priority)
    server.enqueue(priority=5, run_at=LATER)  # scheduled: among the due ones of its level, not counted
    server.enqueue(priority=-3, run_at=LATER)
    server.claim_one()
    s = scale(server)
    assert (s["claimable"], s["ready"], s["running"], s["held_by"]) == (4, 4, 1, [])
    assert s["oldest_ready_age_seconds"] > 0
    # Counted up to `max`, and it says so.
    s = scale(server, max=3)
    assert (s["claimable"], s["ready"], s["capped"]) == (3, 3, True)
    assert len(claimed(server)) == 4  # what it said a claim could take, a claim takes


def test_concurrency_and_rate_hold_claimable_below_ready(server: LiveServer) -> None:
    for _ in range(6):
        server.enqueue()
    configure(server, concurrency=3)
    assert len(claimed(server, limit=1)) == 1
    s = scale(server)
    assert (s["claimable"], s["ready"], s["running"], s["held_by"]) == (2, 5, 1, ["concurrency"])
    assert s["limits"] == {"concurrency": 3, "rate": None}
    assert len(claimed(server)) == 2  # the claim agrees
    assert scale(server)["claimable"] == 0

    configure(server, "r", rate={"limit": 4, "per_seconds": 3600})
    for _ in range(6):
        server.enqueue("r")
    assert len(claimed(server, "r", limit=3)) == 3
    s = scale(server, "r")
    assert (s["claimable"], s["ready"], s["held_by"]) == (1, 3, ["rate"])
    assert s["limits"]["rate"] == {"limit": 4, "per_seconds": 3600}
    assert len(claimed(server, "r")) == 1


def test_group_limits_count_per_group(server: LiveServer) -> None:
    configure(server, group_concurrency=1)
    for group in ("a", "a", "a", "b", "b", "c"):
        server.enqueue(group=group)
    server.enqueue()  # no group: no group limit holds it
    [first] = claimed(server, limit=1)
    s = scale(server)
    assert (s["ready"], s["running"]) == (6, 1)
    assert (s["claimable"], s["held_by"]) == (3, ["groups"])  # one of b, one of c, the one without a group
    assert len(claimed(server)) == 3
    assert first["group"] == "a"

    configure(server, "o", ordered=True)
    late = server.enqueue("o", group="x", priority=9, run_at=LATER)  # heads its group, not due: holds it
    server.enqueue("o", group="x")
    server.enqueue("o", group="y")
    s = scale(server, "o")
    assert (s["claimable"], s["ready"]) == (1, 2)
    assert [j["group"] for j in claimed(server, "o")] == ["y"]
    assert late["status"] == "pending"


def test_a_paused_queue_can_take_nothing(server: LiveServer) -> None:
    server.enqueue()
    assert server.client.post("/queues/q/pause").status_code == 200
    s = scale(server)
    assert (s["claimable"], s["ready"], s["paused"], s["held_by"]) == (0, 1, True, ["paused"])
    assert claimed(server) == []


def test_the_gauges_carry_the_same_figures(server: LiveServer) -> None:
    for _ in range(5):
        server.enqueue("limited")
        server.enqueue("free")
    configure(server, "limited", concurrency=2)
    claimed(server, "free", limit=1)
    gauges = server.services.maintenance["gauges"]
    gauges._next_depth = 0.0  # the depths are due now, not at the next interval
    server.run(gauges.run_once)
    text = server.client.get("/metrics").text

    def gauge(name: str, queue: str) -> float:
        m = re.search(rf'^{name}{{queue="{queue}"}} (\S+)$', text, re.M)
        assert m, (name, queue)
        return float(m.group(1))

    assert gauge("jobq_queue_claimable_jobs", "limited") == scale(server, "limited")["claimable"] == 2
    assert gauge("jobq_queue_claimable_jobs", "free") == scale(server, "free")["claimable"] == 4
    assert gauge("jobq_queue_running_jobs", "free") == 1


def test_scraping_metrics_runs_no_statement(server: LiveServer) -> None:
    """hatchet-dev/hatchet#3790: a metrics endpoint that queries per scrape saturated PostgreSQL under KEDA.
    Here a scrape reads what the background refresh left: with every way to the database cut, 50 scrapes in
    a row still answer, with the figures."""
    configure(server, concurrency=1)
    server.enqueue()
    server.enqueue()
    gauges = server.services.maintenance["gauges"]
    gauges._next_depth = 0.0
    server.run(gauges.run_once)
    db = server.services.db

    def cut(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a scrape reached the database")

    db.connection = cut  # type: ignore[method-assign]
    try:
        for _ in range(50):
            r = server.client.get("/metrics")
            assert r.status_code == 200
            assert 'jobq_queue_claimable_jobs{queue="q"} 1.0' in r.text
    finally:
        del db.connection  # the class's method again


def test_who_may_read_the_scale(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(auth="on", api_key=ENV_KEY)
    with as_key(server, ENV_KEY) as admin:
        assert admin.get("/queues/team-a.x/scale").status_code == 200
    with as_key(server, create_key(db, "keda", ["metrics"])) as scraper:
        assert scraper.get("/queues/team-a.x/scale").json()["claimable"] == 0
    with as_key(server, create_key(db, "team-a-ops", ["admin"], ["team-a.*"])) as ops:
        assert ops.get("/queues/team-a.x/scale").status_code == 200
        problem(ops.get("/queues/team-b.x/scale"), 403, "forbidden")
    with as_key(server, create_key(db, "worker", ["consume", "produce"])) as worker:
        problem(worker.get("/queues/team-a.x/scale"), 403, "forbidden")
    problem(server.client.get("/queues/team-a.x/scale"), 401, "unauthorized")


def test_bad_scale_requests_are_422(server: LiveServer) -> None:
    for params in ({"max": 0}, {"max": 10_001}, {"max": "all"}):
        problem(server.client.get("/queues/q/scale", params=params), 422, "validation-error")
    problem(server.client.get("/queues/no%20spaces/scale"), 422, "validation-error")


def _yaml_blocks() -> list[Any]:
    return [list(yaml.safe_load_all(b)) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]


def test_the_keda_examples_are_scaled_objects_that_read_what_jobq_serves() -> None:
    docs = [d for block in _yaml_blocks() for d in (block if isinstance(block, list) else [block])]
    objects = [d for d in docs if isinstance(d, dict) and d.get("kind") == "ScaledObject"]
    kinds = set()
    for obj in objects:
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        spec = obj["spec"]
        assert spec["scaleTargetRef"]["name"]
        assert isinstance(spec["minReplicaCount"], int) and isinstance(spec["maxReplicaCount"], int)
        for trigger in spec["triggers"]:
            kinds.add(trigger["type"])
            meta = trigger["metadata"]
            if trigger["type"] == "metrics-api":
                assert re.search(r"/queues/[A-Za-z0-9_.:-]+/scale(\?|$)", meta["url"]), meta["url"]
                assert meta["valueLocation"] in QueueScale.model_fields
                assert float(meta["targetValue"]) > 0
                assert trigger["authenticationRef"]["name"]
            elif trigger["type"] == "prometheus":
                assert "jobq_queue_claimable_jobs" in meta["query"]
                assert float(meta["threshold"]) > 0
    assert kinds == {"metrics-api", "prometheus"}
    auth = [d for d in docs if isinstance(d, dict) and d.get("kind") == "TriggerAuthentication"]
    assert auth and auth[0]["spec"]["secretTargetRef"]
