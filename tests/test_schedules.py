"""Schedules: the admin API, the jobs their ticks make (one per tick, however many replicas fire it), and
what happens to ticks missed while no replica ran. Cron and DST themselves: tests/unit/test_cron.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from app.runtime import cli
from tests.processes import run_jobq
from tests.support import LiveServer, problem, wait_until
from tests.test_security import ENV_KEY, as_key, create_key

HOURLY = {"queue": "reports", "cron": "0 * * * *", "payload": {"report": "hourly"}}


def put(server: LiveServer, name: str, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    r = server.client.put(f"/schedules/{name}", json=body)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def scheduled_jobs(db: psycopg.Connection, name: str) -> list[tuple[int, datetime]]:
    rows = db.execute(
        "SELECT id, scheduled_for FROM jobq.jobs WHERE schedule = %s ORDER BY scheduled_for, id", (name,)
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def run_scheduler(server: LiveServer) -> Any:
    return server.run(lambda: server.services.maintenance["scheduler"].run_once())


@pytest.fixture
def quiet(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    """A server whose scheduler runs only when the test says (run_scheduler); a tick up to an hour late
    still counts as on time."""
    return server_factory(  # type: ignore[no-any-return]
        schedule_interval_seconds=0, schedule_grace_seconds=3600, default_max_attempts=7
    )


# --- the API --------------------------------------------------------------------------------------------------


def test_a_schedule_is_created_read_listed_replaced_and_deleted(quiet: LiveServer, db: psycopg.Connection) -> None:
    now = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    created = put(quiet, "hourly-report", HOURLY)
    assert created == {
        "name": "hourly-report",
        "queue": "reports",
        "cron": "0 * * * *",
        "timezone": "UTC",
        "payload": {"report": "hourly"},
        "priority": None,
        "max_attempts": None,
        "group": None,
        "missed": "skip",
        "paused": False,
        "next_run_at": created["next_run_at"],
        "last_run_at": None,
        "created_at": created["created_at"],
        "updated_at": created["updated_at"],
    }
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    assert when(created["next_run_at"]) == next_hour  # by the database clock
    assert quiet.client.get("/schedules/hourly-report").json() == created

    replaced = put(
        quiet,
        "hourly-report",
        {
            **HOURLY,
            "cron": "30 9 * * MON-FRI",
            "timezone": "Europe/Paris",
            "priority": 3,
            "max_attempts": 2,
            "missed": "catch_up",
        },
        status=200,
    )
    assert (replaced["cron"], replaced["timezone"], replaced["priority"], replaced["max_attempts"]) == (
        "30 9 * * MON-FRI",
        "Europe/Paris",
        3,
        2,
    )
    assert replaced["missed"] == "catch_up" and replaced["created_at"] == created["created_at"]
    local = when(replaced["next_run_at"]).astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute, local.isoweekday() <= 5) == (9, 30, True)

    put(quiet, "b-daily", {**HOURLY, "cron": "@daily"})
    listed = quiet.client.get("/schedules").json()["schedules"]
    assert [s["name"] for s in listed] == ["b-daily", "hourly-report"]

    assert quiet.client.delete("/schedules/hourly-report").status_code == 204
    problem(quiet.client.get("/schedules/hourly-report"), 404, "schedule-not-found")
    problem(quiet.client.delete("/schedules/hourly-report"), 404, "schedule-not-found")
    problem(quiet.client.post("/schedules/hourly-report/pause"), 404, "schedule-not-found")
    assert [s["name"] for s in quiet.client.get("/schedules").json()["schedules"]] == ["b-daily"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"cron": "61 * * * *"}, "minute: 61 is out of range 0-59"),
        ({"cron": "* * * *"}, "4 fields"),
        ({"cron": "0 0 30 2 *"}, "never fires"),
        ({"cron": "0 0 * * MON#1"}, "day-of-week: cannot read 'MON#1'"),
        ({"cron": ""}, "body.cron"),
        # Stored as typed, it would read back with a line break in it.
        ({"cron": "0 7\n* * *"}, "character '\\n': separate the fields with spaces"),
        ({"cron": "0 7 * * *\u2003"}, "separate the fields with spaces"),
        ({"timezone": "Mars/Olympus_Mons"}, "unknown time zone 'Mars/Olympus_Mons'"),
        ({"timezone": "../../etc/passwd"}, "unknown time zone"),
        ({"timezone": None}, "body.timezone"),
        ({"queue": "no spaces"}, "body.queue"),
        ({"missed": "all"}, "body.missed"),
        ({"priority": 40000}, "body.priority"),
        ({"max_attempts": 0}, "body.max_attempts"),
        ({"paused": "yes"}, "body.paused"),
        ({"payload": "nul \u0000"}, "NUL"),
        ({"every": "hour"}, "body.every"),
    ],
)
def test_a_bad_schedule_is_422_saying_what_is_wrong(
    shared_server: LiveServer, change: dict[str, Any], says: str, shared_db: psycopg.Connection
) -> None:
    r = shared_server.client.put("/schedules/nightly", json={**HOURLY, **change})
    body = problem(r, 422, "validation-error")
    assert says in body["detail"], body
    assert shared_db.execute("SELECT count(*) FROM jobq.schedules").fetchone() == (0,)


def test_a_bad_schedule_name_is_422(shared_server: LiveServer) -> None:
    problem(shared_server.client.put("/schedules/has space", json=HOURLY), 422, "validation-error")
    problem(shared_server.client.get("/schedules/" + "x" * 129), 422, "validation-error")


def test_applying_the_same_definition_again_keeps_the_next_tick(quiet: LiveServer, db: psycopg.Connection) -> None:
    """A deploy script that PUTs its schedules on every start must neither skip a due tick nor repeat one."""
    put(quiet, "yearly", {**HOURLY, "cron": "@yearly"})
    db.execute("UPDATE jobq.schedules SET next_run_at = '2020-01-01T00:00:00Z' WHERE name = 'yearly'")
    again = put(quiet, "yearly", {**HOURLY, "cron": "@yearly", "payload": "new payload"}, status=200)
    assert when(again["next_run_at"]) == datetime(2020, 1, 1, tzinfo=UTC)
    assert again["payload"] == "new payload"
    changed = put(quiet, "yearly", {**HOURLY, "cron": "0 0 1 7 *"}, status=200)
    assert when(changed["next_run_at"]) > datetime.now(UTC)  # a new expression starts from now


def test_pause_and_resume(quiet: LiveServer, db: psycopg.Connection) -> None:
    put(quiet, "s", {**HOURLY, "cron": "@yearly"})
    paused = quiet.client.post("/schedules/s/pause").json()
    assert (paused["paused"], paused["next_run_at"]) == (True, None)
    # Ticks due while paused are never enqueued, nor on resume.
    db.execute("UPDATE jobq.schedules SET next_run_at = '2020-01-01T00:00:00Z' WHERE name = 's'")
    assert run_scheduler(quiet).enqueued == 0
    # A replace keeps the paused state unless it says otherwise.
    assert put(quiet, "s", {**HOURLY, "cron": "@yearly"}, status=200)["paused"] is True
    resumed = quiet.client.post("/schedules/s/resume").json()
    assert resumed["paused"] is False and when(resumed["next_run_at"]) > datetime.now(UTC)
    assert run_scheduler(quiet).enqueued == 0
    assert scheduled_jobs(db, "s") == []
    assert quiet.client.post("/schedules/s/resume").json() == resumed  # resuming a running schedule: no change
    assert put(quiet, "s", {**HOURLY, "cron": "@yearly", "paused": True}, status=200)["paused"] is True


# --- ticks and jobs -----------------------------------------------------------------------------------------------


def test_a_due_tick_makes_one_job_that_names_its_schedule_and_tick(quiet: LiveServer, db: psycopg.Connection) -> None:
    put(quiet, "s", {**HOURLY, "priority": 4, "max_attempts": 2})
    tick = db.execute("SELECT date_trunc('hour', now())").fetchone()[0]  # type: ignore[index]
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 's'", (tick,))
    assert run_scheduler(quiet).enqueued == 1
    [(job_id, scheduled_for)] = scheduled_jobs(db, "s")
    assert scheduled_for == tick
    job = quiet.job(job_id)
    assert (job["queue"], job["payload"], job["priority"], job["max_attempts"], job["status"]) == (
        "reports",
        {"report": "hourly"},
        4,
        2,
        "pending",
    )
    assert (job["schedule"], when(job["scheduled_for"])) == ("s", tick)
    s = quiet.client.get("/schedules/s").json()
    assert when(s["last_run_at"]) == tick and when(s["next_run_at"]) == tick + timedelta(hours=1)
    assert run_scheduler(quiet).enqueued == 0  # nothing due until the next hour
    # A schedule that names no priority or max_attempts: the defaults when each job is made.
    put(quiet, "plain", HOURLY)
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 'plain'", (tick,))
    assert run_scheduler(quiet).enqueued == 1
    [(plain, _)] = scheduled_jobs(db, "plain")
    assert (quiet.job(plain)["priority"], quiet.job(plain)["max_attempts"]) == (0, 7)
    # Jobs not made by a schedule say so.
    other = quiet.enqueue(payload=1)
    assert (other["schedule"], other["scheduled_for"]) == (None, None)


def test_a_schedule_gives_its_jobs_a_group_and_the_queues_defaults(quiet: LiveServer, db: psycopg.Connection) -> None:
    """`group` rides on every job of the schedule; what the schedule leaves out comes from the queue's
    configuration as it is when each job is made (a change in between counts), else the service's defaults."""
    put(quiet, "grouped", {**HOURLY, "group": "tenant-7"})
    assert quiet.client.get("/schedules/grouped").json()["group"] == "tenant-7"
    r = quiet.client.patch("/queues/reports/config", json={"default_priority": 9, "max_attempts": 3})
    assert r.status_code == 200, r.text
    tick = db.execute("SELECT date_trunc('hour', now())").fetchone()[0]  # type: ignore[index]
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 'grouped'", (tick,))
    assert run_scheduler(quiet).enqueued == 1
    [(job_id, _)] = scheduled_jobs(db, "grouped")
    job = quiet.job(job_id)
    assert (job["group"], job["priority"], job["max_attempts"]) == ("tenant-7", 9, 3)


def test_a_tick_enqueued_twice_makes_one_job(quiet: LiveServer, db: psycopg.Connection) -> None:
    """Two replicas that read the same due schedule and fire the same tick: the second changes nothing."""
    put(quiet, "s", HOURLY)
    tick = db.execute("SELECT date_trunc('hour', now())").fetchone()[0]  # type: ignore[index]
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 's'", (tick,))

    async def twice() -> list[int]:
        from app.db import schedules as store
        from app.db.schedules import Firing

        async with quiet.services.db.connection() as conn:
            [due] = await store.schedules_due(conn, 10)
        firing = Firing(due.name, due.revision, due.next_run_at, [tick], tick + timedelta(hours=1))
        made = []
        for _ in range(2):
            async with quiet.services.db.connection() as conn:
                made.append(len(await store.schedules_fire(conn, [firing], 5)))
        # Even a firing that passes the schedule's guard (its state put back as it was) makes no second
        # job for the tick: the unique (schedule, tick) index does not let it.
        async with quiet.services.db.connection() as conn:
            await conn.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 's'", (tick,))
            made.append(len(await store.schedules_fire(conn, [firing], 5)))
        return made

    assert quiet.run(twice) == [1, 0, 0]
    assert [t for _, t in scheduled_jobs(db, "s")] == [tick]


@pytest.mark.parametrize("missed", ["skip", "catch_up"])
def test_ticks_missed_while_no_replica_ran(quiet: LiveServer, db: psycopg.Connection, missed: str) -> None:
    """Down since 2020, a yearly schedule finds six years of missed ticks: `skip` enqueues none of them,
    `catch_up` one job, for the latest. Either way the schedule then waits for the next tick."""
    put(quiet, "s", {**HOURLY, "cron": "@yearly", "missed": missed})
    db.execute("UPDATE jobq.schedules SET next_run_at = '2020-01-01T00:00:00Z' WHERE name = 's'")
    this_year = db.execute("SELECT date_trunc('year', now())").fetchone()[0]  # type: ignore[index]
    assert run_scheduler(quiet).enqueued == (1 if missed == "catch_up" else 0)
    assert [t for _, t in scheduled_jobs(db, "s")] == ([this_year] if missed == "catch_up" else [])
    s = quiet.client.get("/schedules/s").json()
    assert when(s["next_run_at"]) == this_year.replace(year=this_year.year + 1)


def test_late_ticks_within_the_grace_are_all_enqueued(quiet: LiveServer, db: psycopg.Connection) -> None:
    """A pass that comes late (a busy process, a replica restarting) still enqueues every tick it finds
    within JOBQ_SCHEDULE_GRACE_SECONDS: one job each, in order."""
    put(quiet, "s", {**HOURLY, "cron": "*/5 * * * * *"})
    start = db.execute(
        "SELECT to_timestamp(floor(extract(epoch FROM now()) / 5) * 5) - interval '30 seconds'"
    ).fetchone()[0]  # type: ignore[index]
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 's'", (start,))
    made = run_scheduler(quiet).enqueued
    ticks = [t for _, t in scheduled_jobs(db, "s")]
    assert made == len(ticks) >= 7
    assert ticks == [start + timedelta(seconds=5 * i) for i in range(len(ticks))]


def test_an_unreadable_schedule_does_not_keep_the_scheduler_busy(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """A stored cron or time zone this process refuses (written by another release, or a zone missing from
    this machine's zone data) is left alone, said once, and not read again pass after pass while it stays
    due; even a full batch of them does not hold back the schedules it can read. Changed, it is read again."""
    quiet: LiveServer = server_factory(schedule_interval_seconds=0, schedule_grace_seconds=3600)
    for i in range(105):
        put(quiet, f"bad-{i:03}", HOURLY)
    put(quiet, "good", HOURLY)
    tick = db.execute("SELECT date_trunc('hour', now())").fetchone()[0]  # type: ignore[index]
    db.execute("UPDATE jobq.schedules SET cron = '0 0 31 2 *', next_run_at = %s - interval '1 day'"
               " WHERE name <> 'good'", (tick,))  # fmt: skip
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 'good'", (tick,))
    first = run_scheduler(quiet)  # returns: the unreadable batch is not read again and again
    assert first.enqueued == 1 and [t for _, t in scheduled_jobs(db, "good")] == [tick]
    assert first.due_in is not None and first.due_in > 0  # the next tick it can fire, not one overdue forever
    assert run_scheduler(quiet).enqueued == 0
    put(quiet, "bad-000", HOURLY, status=200)  # a readable cron again
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 'bad-000'", (tick,))
    assert run_scheduler(quiet).enqueued == 1


# --- who may ---------------------------------------------------------------------------------------------------


def test_schedules_need_an_admin_key_for_their_queue(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, schedule_interval_seconds=0)
    root = as_key(server, ENV_KEY)
    assert root.put("/schedules/secret", json={**HOURLY, "queue": "secret"}).status_code == 201
    limited = as_key(server, create_key(db, "pub-admin", ["admin"], ["pub*"]))
    assert limited.put("/schedules/pub-mine", json={**HOURLY, "queue": "pub.a"}).status_code == 201
    assert [s["name"] for s in limited.get("/schedules").json()["schedules"]] == ["pub-mine"]
    problem(limited.get("/schedules/secret"), 404, "schedule-not-found")
    problem(limited.delete("/schedules/secret"), 404, "schedule-not-found")
    problem(limited.post("/schedules/secret/pause"), 404, "schedule-not-found")
    problem(limited.put("/schedules/other", json={**HOURLY, "queue": "secret"}), 403, "forbidden")
    # A schedule of another queue under the same name is not taken over.
    problem(limited.put("/schedules/secret", json={**HOURLY, "queue": "pub.b"}), 403, "forbidden")
    assert root.get("/schedules/secret").json()["queue"] == "secret"
    for scopes in (["produce", "consume"], ["metrics"]):
        other = as_key(server, create_key(db, f"k-{scopes[0]}", scopes))
        problem(other.get("/schedules"), 403, "forbidden")
        problem(other.put("/schedules/x", json=HOURLY), 403, "forbidden")
    problem(as_key(server, None).get("/schedules"), 401, "unauthorized")


def test_a_schedule_name_tells_a_queue_limited_key_nothing_of_other_queues(
    server_factory, db: psycopg.Connection
) -> None:  # type: ignore[no-untyped-def]
    """The review's oracle: PUT /schedules/{name} answered 403 for a name held by another queue's schedule and
    201 for a free one. A key limited to some queues now creates schedules only under names matching its
    patterns: any other name that is not one of its own schedules is refused alike, held elsewhere or free."""
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, schedule_interval_seconds=0)
    root = as_key(server, ENV_KEY)
    assert root.put("/schedules/acme-billing", json={**HOURLY, "queue": "acme"}).status_code == 201
    assert root.put("/schedules/pub-taken", json={**HOURLY, "queue": "acme"}).status_code == 201
    limited = as_key(server, create_key(db, "pub-admin", ["admin"], ["pub*"]))
    held, free = (limited.put(f"/schedules/{n}", json={**HOURLY, "queue": "pub.a"}) for n in ("acme-billing", "acme-x"))
    assert (held.status_code, free.status_code) == (403, 403)
    assert held.text.replace("acme-billing", "NAME") == free.text.replace("acme-x", "NAME")
    # Its own namespace: created, replaced; a name in it that another queue's schedule holds (one a key
    # unlimited to queues made there) is the one thing it can learn, and only of names of its own kind.
    assert limited.put("/schedules/pub-nightly", json={**HOURLY, "queue": "pub.a"}).status_code == 201
    assert limited.put("/schedules/pub-nightly", json={**HOURLY, "queue": "pub.b"}).status_code == 200
    problem(limited.put("/schedules/pub-taken", json={**HOURLY, "queue": "pub.a"}), 409, "schedule-name-taken")
    assert root.get("/schedules/acme-billing").json()["queue"] == "acme"
    assert root.get("/schedules/pub-taken").json()["queue"] == "acme"
    # A schedule of its queues made under another name (by a key unlimited to queues) stays its to change.
    assert root.put("/schedules/daily", json={**HOURLY, "queue": "pub.c"}).status_code == 201
    assert limited.put("/schedules/daily", json={**HOURLY, "queue": "pub.c", "cron": "@daily"}).status_code == 200


def test_the_number_of_schedules_is_capped(server_factory) -> None:  # type: ignore[no-untyped-def]
    """The review made 3,000 every-second schedules with one admin key: 30,000 jobs in 10 s. At most
    JOBQ_MAX_SCHEDULES exist; past it a new one is 409 `too-many-schedules`, nothing is written, and the
    schedules that exist can still be replaced."""
    server: LiveServer = server_factory(max_schedules=3, schedule_interval_seconds=0)
    for n in range(3):
        assert server.client.put(f"/schedules/s{n}", json=HOURLY).status_code == 201
    body = problem(server.client.put("/schedules/s3", json=HOURLY), 409, "too-many-schedules")
    assert "JOBQ_MAX_SCHEDULES" in body["detail"]
    problem(server.client.get("/schedules/s3"), 404, "schedule-not-found")
    assert server.client.put("/schedules/s0", json={**HOURLY, "cron": "@daily"}).status_code == 200
    assert server.client.delete("/schedules/s1").status_code == 204
    assert server.client.put("/schedules/s3", json=HOURLY).status_code == 201


# --- replicas --------------------------------------------------------------------------------------------------


def every_second(first: datetime, last: datetime) -> list[datetime]:
    return [first + timedelta(seconds=i) for i in range(int((last - first).total_seconds()) + 1)]


@pytest.mark.slow
def test_two_replicas_make_one_job_per_tick(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """Slow: a 1-second schedule runs for 5 s of real time. Both replicas' schedulers wake for every tick and
    race to fire it; each of the 5 ticks makes exactly one job, and none is lost."""
    a: LiveServer = server_factory()
    b: LiveServer = server_factory()
    created = put(a, "every-second", {"queue": "q", "cron": "* * * * * *", "payload": None})
    first = when(created["next_run_at"])
    b.services.maintenance["scheduler"].poke()  # b learns of it now rather than within its 5 s interval
    wait_until(lambda: any(t >= first + timedelta(seconds=4) for _, t in scheduled_jobs(db, "every-second")),
               what="five ticks")  # fmt: skip
    assert a.client.post("/schedules/every-second/pause").status_code == 200
    ticks = [t for _, t in scheduled_jobs(db, "every-second")]
    assert len(ticks) == len(set(ticks)), "a tick made two jobs"
    assert ticks[:5] == every_second(first, first + timedelta(seconds=4))
    assert a.services.maintenance["scheduler"].passes > 1 and b.services.maintenance["scheduler"].passes > 1


@pytest.mark.slow
def test_a_restart_neither_doubles_nor_loses_a_tick(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    """Slow: an every-second schedule across a stop and a start of the only replica (a few seconds). The
    ticks due while it was down are enqueued late by the new process, each once."""
    a: LiveServer = server_factory()
    first = when(put(a, "s", {"queue": "q", "cron": "* * * * * *", "payload": None})["next_run_at"])
    wait_until(lambda: len(scheduled_jobs(db, "s")) >= 2, what="two ticks")
    a.stop()
    stopped = db.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    b: LiveServer = server_factory()
    wait_until(lambda: any(t > stopped + timedelta(seconds=1) for _, t in scheduled_jobs(db, "s")),
               what="ticks after the restart")  # fmt: skip
    assert b.client.post("/schedules/s/pause").status_code == 200
    ticks = [t for _, t in scheduled_jobs(db, "s")]
    assert ticks == every_second(first, ticks[-1])  # every tick, once, none missing


# --- the command line -----------------------------------------------------------------------------------------


def test_jobq_schedules_commands(
    server_factory, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """The command in this process (each `jobq` subprocess would take a second to start); its exit codes are
    those of every command over the HTTP API (app/runtime/cli/remote.py)."""
    # No access log: the server runs in this process, and its lines would land in the captured stdout.
    server: LiveServer = server_factory(auth="on", api_key=ENV_KEY, schedule_interval_seconds=0, access_log=False)
    admin = create_key(db, "ops", ["admin"])

    def jobq(*args: str, url: str = server.url, key: str | None = admin) -> tuple[int, str, str]:
        monkeypatch.setenv("JOBQ_URL", url)
        if key is None:
            monkeypatch.delenv("JOBQ_API_KEY", raising=False)
        else:
            monkeypatch.setenv("JOBQ_API_KEY", key)
        code = cli.main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = jobq("schedules", "put", "nightly", "--queue", "reports", "--cron", "0 3 * * *", "--timezone",
                          "Europe/Paris", "--payload", '{"report": "nightly"}', "--max-attempts", "2")  # fmt: skip
    assert code == 0, err
    assert out.startswith("created nightly: 0 3 * * * (Europe/Paris) -> reports; next run "), out
    shown = server.client.get("/schedules/nightly", headers={"authorization": f"Bearer {admin}"}).json()
    assert (shown["queue"], shown["payload"], shown["max_attempts"]) == ("reports", {"report": "nightly"}, 2)
    code, out, _ = jobq("schedules", "put", "nightly", "--queue", "reports", "--cron", "0 3 * * *", "--json")
    assert code == 0 and json.loads(out)["max_attempts"] is None  # replaced: left out is the default
    shown = json.loads(out)

    code, out, err = jobq("schedules", "list")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["NAME", "QUEUE", "CRON", "TIMEZONE", "NEXT", "RUN", "LAST", "RUN", "STATE"]
    assert row.split()[:2] == ["nightly", "reports"] and shown["next_run_at"] in row and row.endswith("active")
    assert json.loads(jobq("schedules", "list", "--json")[1]) == [shown]

    assert json.loads(jobq("schedules", "pause", "nightly", "--json")[1])["paused"] is True
    assert jobq("schedules", "resume", "nightly")[1].startswith("nightly: 0 3 * * * (UTC) -> reports; next run")
    assert json.loads(jobq("schedules", "get", "nightly", "--json")[1])["name"] == "nightly"

    code, _, err = jobq("schedules", "put", "x", "--queue", "q", "--cron", "0 25 * * *")
    assert code == 2 and "hour: 25 is out of range 0-23" in err and "(422 validation-error)" in err, err
    code, _, err = jobq("schedules", "put", "x", "--queue", "q", "--cron", "@daily", "--payload", "{nope")
    assert code == 2 and "--payload is not JSON" in err

    assert jobq("schedules", "delete", "nightly")[:2] == (0, "nightly: deleted (the jobs it made stay)\n")
    code, _, err = jobq("schedules", "get", "nightly")
    assert code == 3 and err.startswith("jobq: schedule nightly: ") and "(404 schedule-not-found)" in err
    code, _, err = jobq("schedules", "list", key=None)
    assert code == 4 and "(401 unauthorized)" in err
    code, _, err = jobq("schedules", "list", url="http://127.0.0.1:1")
    assert code == 1 and err.startswith("jobq: cannot reach http://127.0.0.1:1")


def test_jobq_schedules_help() -> None:
    r = run_jobq("schedules", "put", "--help")
    assert r.returncode == 0
    for text in ("--queue", "--cron", "--timezone", "--payload", "--missed", "--paused", "--url", "exit codes"):
        assert text in r.stdout, text
    assert "schedules" in run_jobq("--help").stdout
