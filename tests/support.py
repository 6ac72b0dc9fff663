"""Helpers for the tests: the service on a real socket in a background thread, and short API calls."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import orjson
import psycopg
import uvicorn

from app.db import distribute
from app.db.migrate import load_migrations
from app.main import JobqApp, create_app
from app.runtime.server import server_config
from app.services import Services
from app.settings import Settings

T = TypeVar("T")

# Figures a test measured (a failover's outage, a migration's longest stall), printed at the end of the run
# (tests/conftest.py) so that a CI log shows them; never asserted on (no timed assertions).
MEASURED: list[str] = []


def report(line: str) -> None:
    MEASURED.append(line)
    print(line)


def whole_lines(path: Path) -> list[str]:
    """The lines of a file another process is appending to, up to its last newline: a last line without one is
    still being written (a test that parsed it would see half a record)."""
    if not path.exists():
        return []
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def wait_until(condition: Callable[[], object], timeout: float = 30, what: str = "condition") -> None:
    """Poll for a state change; fails only when it never happens (no timing is asserted)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout}s")
        time.sleep(0.01)


def leave_while_waiting(
    server: LiveServer, method: str, path: str, body: Any, waiting: Callable[[], object], what: str
) -> None:
    """A client that leaves a waiting request: sends it on a connection of its own, waits until `waiting()`
    says the server holds it (a client that gave up before the server even read its request would leave
    nothing to clean up), then closes the connection without reading an answer."""
    content = orjson.dumps(body) if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {server.bind}:{server.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n\r\n"
    )
    with socket.create_connection((urlsplit(server.url).hostname, server.port), timeout=30) as conn:
        conn.sendall(head.encode() + content)
        wait_until(waiting, what=what)


def record_wakeups(server: LiveServer) -> list[set[str]]:
    """From now on, every "jobs available" that goes through the process's wake-up seam is also appended
    to the returned list. A waiting long-poll's queue is looked at again whenever its presence is renewed
    (every 2 s), so delivery alone does not show that a write woke it: this does."""
    woken: list[set[str]] = []
    wakeups = server.services.wakeups
    available = wakeups.jobs_available

    def recorded(queues: Any) -> None:
        queues = set(queues)
        woken.append(queues)
        available(queues)

    wakeups.jobs_available = recorded
    return woken


def record_finishes(server: LiveServer) -> list[list[int]]:
    """From now on, every "jobs finished" that goes through the process's wake-up seam is also appended to
    the returned list (a waiting request is also looked at whenever its presence is renewed, every 2 s:
    an answer alone does not show that the finishing statement woke it)."""
    finished: list[list[int]] = []
    wakeups = server.services.wakeups
    original = wakeups.jobs_finished

    def recorded(ids: Any) -> None:
        finished.append(list(ids))
        original(ids)

    wakeups.jobs_finished = recorded
    return finished


def record_messages(server: LiveServer) -> list[str]:
    """From now on, every message the process's LISTEN connection receives is also appended to the list."""
    messages: list[str] = []
    wakeups = server.services.wakeups
    original = wakeups.received

    def recorded(payload: str) -> None:
        messages.append(payload)
        original(payload)

    wakeups.received = recorded
    return messages


def settle_long_poll(server: LiveServer, queue: str = "q") -> None:
    """Wait until a parked long-poll on `queue` has nothing more under way: the queue announced to other
    processes, the wake-up sender idle (an announcement is followed by one more look for jobs), and the
    queue's claim dispatcher between statements."""
    wakeups, dispatcher = server.services.wakeups, server.services.dispatcher

    def settled() -> bool:
        return wakeups.announced(queue) and wakeups.idle() and dispatcher.settled(queue)

    wait_until(settled, what=f"the long-poll on {queue} to settle")


class LiveServer:
    """uvicorn serving create_app(settings) on <bind>:<free port> (127.0.0.1 unless told), lifespan included,
    configured as `jobq serve` configures it."""

    def __init__(self, settings: Settings, tracer_provider: Any = None, bind: str = "127.0.0.1") -> None:
        self.settings = settings
        self.bind = bind
        self.app: JobqApp = create_app(settings, tracer_provider=tracer_provider)
        config = server_config(
            self.app, settings, host=bind, port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="jobq-test-server", daemon=True)
        self.url = ""
        self.client: httpx.Client

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("test server failed to start")
            if time.monotonic() > deadline:
                raise TimeoutError("test server did not start in 30s")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.bind, self.bind)
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=60)
        return self

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def run(self, make: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
        """Run a coroutine on the server's event loop (for its services' internals, such as the rescuer)."""

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    @property
    def services(self) -> Services:
        """The parts the server's lifespan built (app/services.py)."""
        return self.app.services

    # -- short API calls ------------------------------------------------------------------------------

    def enqueue(self, queue: str = "q", payload: Any = None, **fields: Any) -> dict[str, Any]:
        r = self.client.post(f"/queues/{queue}/jobs", json={"payload": payload, **fields})
        assert r.status_code in (200, 201), r.text
        return r.json()  # type: ignore[no-any-return]

    def claim(self, queue: str = "q", worker: str = "w", **fields: Any) -> list[dict[str, Any]]:
        r = self.client.post(f"/queues/{queue}/claim", json={"worker": worker, **fields})
        assert r.status_code == 200, r.text
        return r.json()["jobs"]  # type: ignore[no-any-return]

    def claim_one(self, queue: str = "q", worker: str = "w", **fields: Any) -> dict[str, Any]:
        jobs = self.claim(queue, worker, **fields)
        assert len(jobs) == 1, jobs
        return jobs[0]

    def claim_in_background(self, queue: str = "q", **fields: Any) -> Callable[[], list[dict[str, Any]]]:
        """Start a (long-poll) claim on its own connection and thread; returns a function that waits
        for its answer."""
        result: list[list[dict[str, Any]]] = []

        def run() -> None:
            with httpx.Client(base_url=self.url, timeout=60) as c:
                r = c.post(f"/queues/{queue}/claim", json={"worker": "w", **fields})
                result.append(r.json()["jobs"])

        thread = threading.Thread(target=run)
        thread.start()

        def answer() -> list[dict[str, Any]]:
            thread.join(60)
            return result[0]

        return answer

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.client.get(f"/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]


def problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """Assert a problem+json answer of this status and type; returns its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:jobq:problem:{slug}", body
    assert body["status"] == status
    assert body["title"] and body["detail"]
    return body


class TcpProxy:
    """A TCP relay to the database that a test can cut (every connection dropped, new ones refused)
    and restore: a database outage without touching the database."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.up = True
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tcp-proxy", daemon=True)

    def start(self) -> TcpProxy:
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        return self

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))

    def cut(self) -> None:
        def drop() -> None:
            self.up = False
            for w in list(self._writers):
                w.transport.abort()

        self.loop.call_soon_threadsafe(drop)

    def restore(self) -> None:
        self.loop.call_soon_threadsafe(lambda: setattr(self, "up", True))

    def stop(self) -> None:
        async def close() -> None:
            self.up = False
            for w in list(self._writers):
                w.transport.abort()
            if self._server:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


# A statement of this database waiting for a lock, by a fragment of its text. On Citus the wait is on the worker
# node holding the shard: citus_lock_waits shows it with the statement as the coordinator was sent it.
WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND strpos(query, %s) > 0"
)
WAITING_CITUS = "SELECT count(DISTINCT waiting_gpid) FROM citus_lock_waits WHERE strpos(blocked_statement, %s) > 0"


def lock_waiters(conn: psycopg.Connection[Any], text: str = "") -> int:
    citus = conn.execute("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')").fetchone() == (True,)
    row = conn.execute(WAITING_CITUS if citus else WAITING, (text,)).fetchone()
    return int(row[0]) if row else 0


def migrate_output(url: str) -> str:
    """What `jobq migrate` prints on the empty database `url`: every migration, and on Citus every table it
    distributes."""
    applied = "applied: " + ", ".join(m.name for m in load_migrations())
    with psycopg.connect(url) as conn:
        if conn.execute(distribute.HAS_CITUS).fetchone() == (True,):  # then it also distributes every table
            applied += "".join(f", distributed {t}" for t in distribute.BY_QUEUE + distribute.REFERENCE)
    return applied
