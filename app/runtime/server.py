"""Runs the service under uvicorn, in one process or several, until SIGTERM or SIGINT stops it."""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn
from uvicorn.supervisors import Multiprocess

from app.runtime import logs

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


def serve(
    *, host: str, port: int, workers: int, log_level: str, log_format: logs.LogFormat = "json", graceful_timeout: int
) -> bool:
    """Serve until a stop signal. True when a signal stopped it after a graceful shutdown; False when it
    stopped on its own (the application or a worker failed to start)."""
    config = uvicorn.Config(
        "app.main:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        log_config=logs.dict_config(log_level, log_format),
        access_log=False,
        # No `server: uvicorn` on every answer: it advertises the stack, and each header costs per request.
        server_header=False,
        timeout_graceful_shutdown=graceful_timeout,
        proxy_headers=False,
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
