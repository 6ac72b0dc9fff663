"""Stop signals: a SIGTERM or SIGINT starts the drain of the long-polls before the server's own handling."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any

log = logging.getLogger("jobq")


def drain_on_stop_signal(drain: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """On SIGTERM/SIGINT, start draining the long-polls at once. uvicorn runs the lifespan shutdown only after
    every request in flight has finished, and a waiting long-poll would hold that up for wait_seconds: so
    waiting claims are answered [] now, new ones get [] too, and nothing is handed to a connection about to
    close; requests waiting for a job's result answer with the job as it is. The handler is chained in front
    of the server's own (uvicorn's, installed before the lifespan starts), which it then calls. Signals
    reach only the main thread: in a server on another thread (tests) this does nothing. Returns the
    function that puts the server's handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task[None]] = []

    def start_drain() -> None:
        if not draining:
            log.info("stop signal: answering waiting claims, finishing requests in flight")
            draining.append(loop.create_task(drain()))

    previous: dict[int, Callable[[int, FrameType | None], Any]] = {}

    def on_signal(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(start_drain)
        previous[sig](sig, frame)

    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if callable(handler):  # a server that handles stop signals itself; otherwise leave them be
            previous[sig] = handler
            signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
