"""Runs the service under uvicorn, in one process or several, until SIGTERM or SIGINT stops it."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from app.observability import logs
from app.runtime.connections import BoundedHttpToolsProtocol, ConnectionLimits
from app.settings import Settings

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Supervisor(Multiprocess):
    """uvicorn's supervisor of worker processes, noting whether a signal (not a failed worker) ended it."""

    signalled = False

    def handle_term(self) -> None:
        self.signalled = True
        super().handle_term()

    def handle_int(self) -> None:
        self.signalled = True
        super().handle_int()


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for jobq: bounded connections (app/runtime/connections.py), no proxy-header
    rewriting of the client address (app/observability/clients.py decides whom to believe), no access log of
    uvicorn's own (jobq writes its own lines), no `server: uvicorn` on every answer (it advertises the
    stack, and each header costs per request), and no WebSocket protocol: jobq has no WebSocket route, and
    uvicorn's default loads the `websockets` package into every process (measured:
    docs/benchmarks-history.md#memory)."""
    config = uvicorn.Config(
        app,
        http=BoundedHttpToolsProtocol,
        ws="none",
        proxy_headers=False,
        access_log=False,
        server_header=False,
        **options,
    )
    # Read by the protocol of every connection; a plain attribute, so that the configuration still pickles
    # for the worker processes of --workers N.
    config.jobq_limits = ConnectionLimits.of(settings)  # type: ignore[attr-defined]
    return config


def serve(
    *,
    settings: Settings,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    log_format: logs.LogFormat = "json",
    graceful_timeout: int,
) -> bool:
    """Serve until a stop signal. True when a signal stopped it after a graceful shutdown; False when it
    stopped on its own (the application or a worker failed to start)."""
    config = server_config(
        "app.main:create_app",
        settings,
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        log_config=logs.dict_config(log_level, log_format),
        timeout_graceful_shutdown=graceful_timeout,
    )
    # A single uvicorn server restores the handlers it found once it has shut down and raises the signal
    # again. These are what it finds: they note the signal instead of letting the default action kill
    # the process before the caller has stopped the embedded PostgreSQL.
    noted: list[int] = []

    def note(sig: int, _frame: FrameType | None) -> None:
        noted.append(sig)

    previous = {sig: signal.signal(sig, note) for sig in STOP_SIGNALS}
    try:
        if workers > 1:
            supervisor = _Supervisor(config, sockets=[config.bind_socket()])
            supervisor.run()
            return supervisor.signalled
        server = uvicorn.Server(config)
        server.run()
        return server.started and bool(noted)
    except SystemExit:  # uvicorn's way out when the port is taken or the application fails to start
        return False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
