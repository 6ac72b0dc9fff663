"""The `jobq` daily-work commands (enqueue, queues, stats, jobs, job, retry, cancel, redrive, pause, resume)
run as a script or a person would: the installed command, against a live service, over its HTTP API."""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import psycopg
import pytest

from app.auth.keys import new_key
from app.db import keys as store_keys
from app.runtime.embedded import free_port
from tests.processes import JOBQ, jobq_env, run_jobq
from tests.support import LiveServer

ADMIN_KEY = "cli-admin-key-" + "a" * 40


def jobq(
    server: LiveServer, *args: str, key: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"JOBQ_URL": server.url}
    if key is not None:
        env["JOBQ_API_KEY"] = key
    return subprocess.run(
        [JOBQ, *args], env=jobq_env(**env), input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return r.stdout


def as_json(r: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(r))


def test_help_names_the_daily_commands_and_their_exit_codes() -> None:
    top = run_jobq("--help")
    for command in ("enqueue", "queues", "stats", "jobs", "job", "retry", "cancel", "redrive", "pause", "resume"):
        assert f"    {command} " in top.stdout, command
    assert "JOBQ_URL" in top.stdout and "JOBQ_API_KEY" in top.stdout
    for command in ("enqueue", "stats", "jobs", "retry"):
        r = run_jobq(command, "--help")
        assert r.returncode == 0
        assert "--url" in r.stdout and "--json" in r.stdout and "exit codes" in r.stdout and "examples" in r.stdout


def test_enqueue_then_read_it_back_as_tables_and_json(server: LiveServer) -> None:
    made = as_json(jobq(server, "enqueue", "emails", '{"to": "ada@example.com"}', "--priority", "5", "--json"))
    assert made["payload"] == {"to": "ada@example.com"} and made["priority"] == 5 and made["status"] == "pending"
    said = ok(jobq(server, "enqueue", "emails", "-", "--delay", "3600", stdin='["from", "stdin"]'))
    assert said.startswith("job ") and " enqueued on emails (due in " in said
    later = int(said.split()[1])
    assert server.client.get(f"/jobs/{later}").json()["payload"] == ["from", "stdin"]
    keyed = ok(jobq(server, "enqueue", "emails", "1", "--idempotency-key", "k1"))
    again = ok(jobq(server, "enqueue", "emails", "2", "--idempotency-key", "k1"))
    assert "already exists" in again and keyed.split()[1] == again.split()[1]

    # queues: the API's document with --json, a table of the same figures without
    listed, expected = as_json(jobq(server, "queues", "--json")), server.client.get("/queues").json()
    for doc in (listed, expected):
        assert doc["queues"][0].pop("oldest_ready_age_seconds") > 0  # it grows between the two reads
    assert listed == expected
    header, row = ok(jobq(server, "queues")).splitlines()
    assert header.split()[:9] == [
        "QUEUE", "STATE", "READY", "SCHEDULED", "WAITING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"
    ]  # fmt: skip
    assert row.split()[:9] == ["emails", "active", "2", "1", "0", "0", "0", "0", "0"]
    # it follows the pages of GET /queues
    server.enqueue("zz", 1)
    paged = as_json(jobq(server, "queues", "--json", "--page-size", "1"))
    assert [q["queue"] for q in paged["queues"]] == ["emails", "zz"] and paged["next_cursor"] is None

    # job: every field a person looks for, and the JSON the API returns
    shown = ok(jobq(server, "job", str(made["id"])))
    assert shown.splitlines()[0] == f"job {made['id']} on emails"
    assert "status          pending" in shown and "ada@example.com" in shown and "attempts        0 of 5" in shown
    assert as_json(jobq(server, "job", str(made["id"]), "--json")) == server.client.get(f"/jobs/{made['id']}").json()

    # stats: the figures, and the document
    stats = ok(jobq(server, "stats", "emails"))
    assert stats.startswith("emails (active)") and "ready 2  scheduled 1" in stats
    assert as_json(jobq(server, "stats", "emails", "--json", "--window", "600"))["window"]["seconds"] == 600


def test_enqueue_depends_on(server: LiveServer) -> None:
    first, second = server.enqueue("etl", 1), server.enqueue("etl", 2)
    said = ok(jobq(server, "enqueue", "load", "3", "--depends-on", str(first["id"]), "--depends-on", str(second["id"])))
    assert " enqueued on load (waiting for 2 of its dependencies to complete)" in said
    job = server.job(int(said.split()[1]))
    assert job["depends_on"] == [first["id"], second["id"]] and job["status"] == "waiting"
    shown = ok(jobq(server, "job", str(job["id"])))
    assert f"depends on      {first['id']} {second['id']}" in shown and "waiting for     2" in shown
    assert "waiting" in ok(jobq(server, "jobs", "load", "--status", "waiting"))
    r = jobq(server, "enqueue", "load", "4", "--depends-on", "999999", "--on-dependency-failure", "run")
    assert r.returncode != 0 and "999999" in r.stderr


def test_enqueue_unique(server: LiveServer) -> None:
    said = ok(jobq(server, "enqueue", "digests", '{"c": 7}', "--unique-key", "digest-7", "--unique-for", "3600"))
    job_id = int(said.split()[1])
    again = ok(jobq(server, "enqueue", "digests", '{"c": 8}', "--unique-key", "digest-7", "--unique-for", "3600"))
    assert f"job {job_id} already exists on digests with unique key 'digest-7'" in again
    shown = ok(jobq(server, "job", str(job_id)))
    assert "unique key      digest-7" in shown and "unique while    pending running completed" in shown
    assert "unique window   " in shown
    first = as_json(
        jobq(
            server, "enqueue", "q", "1", "--unique", "--unique-while", "pending", "--unique-while", "running", "--json"
        )
    )
    assert first["unique"]["while"] == ["pending", "running"] and first["unique"]["for_seconds"] is None
    r = jobq(server, "enqueue", "q", "1", "--unique-while", "pending")
    assert r.returncode != 0 and "pending and running" in r.stderr


def test_enqueue_debounced(server: LiveServer) -> None:
    args = ["--debounce", "reindex-9", "--debounce-seconds", "600", "--debounce-max-wait", "3600"]
    said = ok(jobq(server, "enqueue", "search", '{"rev": 1}', *args))
    job_id = int(said.split()[1])
    again = ok(jobq(server, "enqueue", "search", '{"rev": 2}', *args))
    assert f"job {job_id} on search replaced: debounce key 'reindex-9'" in again
    assert server.job(job_id)["payload"] == {"rev": 2}
    shown = ok(jobq(server, "job", str(job_id)))
    assert "debounce key    reindex-9" in shown
    assert "600 s after the latest enqueue, at most 3600 s after the first" in shown
    r = jobq(server, "enqueue", "search", "1", "--debounce", "k")
    assert r.returncode != 0 and "--debounce-seconds" in r.stderr


def test_jobs_lists_by_status_and_follows_pages(server: LiveServer) -> None:
    for i in range(7):
        server.enqueue("q", i)
    for _ in range(3):
        c = server.claim_one("q")
        r = server.client.post(
            f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": "boom\nline 2", "retry": False}
        )
        assert r.status_code == 200
    table = ok(jobq(server, "jobs", "q", "--status", "failed")).splitlines()
    assert table[0].split() == [
        "ID",
        "STATUS",
        "ATTEMPTS",
        "PRIORITY",
        "CREATED",
        "RUN",
        "AT",
        "WORKER",
        "LAST",
        "ERROR",
    ]
    assert len(table) == 4 and all(" failed " in line and line.endswith("boom line 2") for line in table[1:])
    # --limit smaller than what is there: the next page is offered on stderr, and --json carries the cursor
    first = jobq(server, "jobs", "q", "--limit", "4")
    assert len(ok(first).splitlines()) == 5 and "--cursor" in first.stderr
    cursor = first.stderr.rsplit("--cursor ", 1)[1].strip()
    rest = as_json(jobq(server, "jobs", "q", "--cursor", cursor, "--json"))
    assert len(rest["jobs"]) == 3 and rest["next_cursor"] is None
    everything = as_json(jobq(server, "jobs", "q", "--json", "--limit", "1000"))  # pages of the server's 500 at most
    assert sorted(j["id"] for j in everything["jobs"]) == sorted(
        j["id"] for j in server.client.get("/queues/q/jobs", params={"limit": 500}).json()["jobs"]
    )
    empty = jobq(server, "jobs", "q", "--status", "cancelled")
    assert empty.returncode == 0 and empty.stdout == "" and "no cancelled jobs on q" in empty.stderr


def test_retry_and_cancel_take_several_ids_and_report_each(server: LiveServer) -> None:
    pending = server.enqueue("q", 1)["id"]
    done = server.enqueue("q", 2)["id"]  # running: a retry refuses it
    c = server.claim_one("q")
    assert c["id"] == pending
    server.client.post(f"/jobs/{pending}/fail", json={"claim_token": c["claim_token"], "error": "x", "retry": False})
    c = server.claim_one("q")
    assert c["id"] == done

    r = jobq(server, "retry", str(pending), str(done), "999999")
    assert r.returncode == 3  # the first failure's: a state that forbids it
    assert r.stdout.splitlines() == [f"job {pending} retried: pending again, attempts reset (pending)"]
    refused, missing = r.stderr.splitlines()
    assert refused.startswith(f"jobq: job {done}: ") and refused.endswith("(409 invalid-state)")
    assert missing == "jobq: job 999999: No job has this id. (404 job-not-found)"

    r = jobq(server, "cancel", str(pending), "--reason", "sent by mistake", "--json")
    [cancelled] = as_json(r)
    assert cancelled["status"] == "cancelled" and cancelled["last_error"] == "sent by mistake"
    assert server.client.get(f"/jobs/{pending}").json()["status"] == "cancelled"


def test_redrive_counts_then_moves_and_pause_stops_claims(server: LiveServer) -> None:
    for i in range(3):
        job = server.enqueue("mail", i)
        c = server.claim_one("mail")
        server.client.post(
            f"/jobs/{c['id']}/fail", json={"claim_token": c["claim_token"], "error": f"SMTP {450 + i}", "retry": False}
        )
        assert c["id"] == job["id"]
    said = ok(jobq(server, "redrive", "mail", "--dry-run", "--error-contains", "SMTP 45"))
    assert said == "mail: 3 failed job(s) would be redriven (dry run: nothing moved)\n"
    assert server.client.get("/queues/mail/stats").json()["counts"]["failed"] == 3
    assert as_json(jobq(server, "redrive", "mail", "--limit", "2", "--json")) == {
        "queue": "mail",
        "dry_run": False,
        "jobs": 2,
    }
    assert server.client.get("/queues/mail/stats").json()["counts"]["failed"] == 1

    assert ok(jobq(server, "pause", "mail")).startswith("mail: paused")
    assert server.claim("mail") == []
    assert "paused" in ok(jobq(server, "queues"))
    assert as_json(jobq(server, "resume", "mail", "--json")) == {"queue": "mail", "paused": False}
    assert len(server.claim("mail", limit=10)) == 2


def test_failures_are_one_line_and_a_documented_exit_code(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    secured: LiveServer = server_factory(auth="on", api_key=ADMIN_KEY)
    key, selector, key_hash = new_key()
    store_keys.api_key_insert(db, "producer", selector, key_hash, ["produce"], None)

    def fails(code: int, *args: str, key: str | None = ADMIN_KEY, text: str = "") -> None:
        r = jobq(secured, *args, key=key)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert r.stdout == "" and r.stderr.count("\n") == 1 and r.stderr.startswith("jobq: "), r.stderr
        assert text in r.stderr, (text, r.stderr)

    fails(4, "queues", key=None, text="(401 unauthorized); set JOBQ_API_KEY or pass --api-key")
    fails(4, "queues", key="jobq_nope_nope", text="(401 unauthorized)")
    fails(4, "stats", "q", key=key, text="(403 forbidden)")  # a produce key reads no statistics
    fails(2, "enqueue", "bad queue!", "1", text="(422 validation-error)")
    fails(2, "enqueue", "q", "{not json", text="PAYLOAD is not JSON")
    fails(2, "enqueue", "q", "hello", text="""(a string is quoted: '"hello"')""")
    fails(2, "enqueue", "q", "NaN", text="PAYLOAD is not JSON")
    usage = jobq(secured, "job", "0")  # argparse's usage line, then the error naming the argument
    assert usage.returncode == 2 and "argument ID: 0 is outside 1..9223372036854775807" in usage.stderr
    fails(3, "job", "424242", text="jobq: job 424242: No job has this id. (404 job-not-found)")
    # what a produce key may do, it does
    assert ok(jobq(secured, "enqueue", "q", "1", key=key)).startswith("job ")

    nothing = LiveServer.__new__(LiveServer)
    nothing.url = f"http://127.0.0.1:{free_port()}"
    r = jobq(nothing, "queues")
    assert r.returncode == 1 and r.stderr.startswith(f"jobq: cannot reach {nothing.url}: ") and "JOBQ_URL" in r.stderr
    r = run_jobq("queues", "--url", "ftp://example")
    assert r.returncode == 2 and r.stderr.startswith("jobq: --url: not an http(s) URL")
    r = run_jobq("queues", env={"JOBQ_URL": secured.url + "/nowhere", "JOBQ_API_KEY": ADMIN_KEY})
    assert r.returncode == 1 and "(404 not-found); is " in r.stderr


def test_stats_watch_prints_a_document_a_line_until_interrupted(server: LiveServer) -> None:
    server.enqueue("w", 1)
    proc = subprocess.Popen(
        [JOBQ, "stats", "w", "--watch", "--interval", "0.5", "--json"],
        env=jobq_env(JOBQ_URL=server.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a suite started in the background (`make test &`) passes SIGINT ignored to its
        # children, and Python then never turns SIGINT into KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        server.enqueue("w", 2)
        second = json.loads(proc.stdout.readline())
        while second["counts"]["ready"] != 2:  # a refresh that came before the enqueue
            second = json.loads(proc.stdout.readline())
        assert first["queue"] == "w" and first["counts"]["ready"] == 1
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err == ""


@pytest.mark.parametrize("flag", ["--api-key", None])
def test_the_key_comes_from_the_flag_or_the_environment(server_factory, flag: str | None) -> None:  # type: ignore[no-untyped-def]
    secured: LiveServer = server_factory(auth="on", api_key=ADMIN_KEY)
    if flag:
        r = run_jobq("queues", "--json", "--url", secured.url, flag, ADMIN_KEY)
    else:
        r = run_jobq("queues", "--json", env={"JOBQ_URL": secured.url, "JOBQ_API_KEY": ADMIN_KEY})
    assert as_json(r) == {"queues": [], "next_cursor": None}
