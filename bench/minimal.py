"""`Prefer: return=minimal` against the full answer (issue 22): single enqueue, batch enqueue (1,000 a
request, 1 client) and claim 1 + complete, each path measured with and without the preference on one
service, in alternating order (full first in odd rounds, minimal first in even ones), every measurement
from the same start (the table truncated, reloaded, vacuumed and analyzed). On a shared machine the
absolute rates drift between phases; the ratio inside one round, and the API CPU per job, are the figures
to read."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench.harness import Worker, preload
from bench.phases import ClaimComplete, Enqueue

BATCH = 1000
Measure = Callable[[int, Worker, str], dict[str, Any]]


def _paths(port: int, clients: int, drain_rows: int) -> dict[str, tuple[str, int, int, Callable[[bool], Worker]]]:
    """key: (label, connections, jobs loaded before each measurement, the worker with or without minimal)."""
    return {
        "enqueue": ("enqueue, single-job requests", clients, 0, lambda m: Enqueue(port, 1, minimal=m)),
        "batch": (f"enqueue, batches of {BATCH:,}", 1, 0, lambda m: Enqueue(port, BATCH, minimal=m)),
        "claim1": ("claim 1 + complete", clients, drain_rows, lambda m: ClaimComplete(port, 1, minimal=m)),
    }


def minimal_ab(url: str, port: int, clients: int, rounds: int, drain_rows: int, measure: Measure) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (label, n, rows, make) in _paths(port, clients, drain_rows).items():
        runs: dict[str, list[dict[str, Any]]] = {"full": [], "minimal": []}
        for r in range(rounds):
            for variant in ("full", "minimal") if r % 2 == 0 else ("minimal", "full"):
                preload(url, rows)
                runs[variant].append(measure(n, make(variant == "minimal"), f"{label}, {variant}, round {r + 1}"))
        rate = [m["rate"] / f["rate"] for f, m in zip(runs["full"], runs["minimal"], strict=True)]
        cpu = [m["api_us_per_job"] / f["api_us_per_job"] for f, m in zip(runs["full"], runs["minimal"], strict=True)]
        out[key] = {"label": label, "connections": n, **runs, "rate_ratio": rate, "api_cpu_ratio": cpu}
        print(
            f"{label}, {n} connection(s): minimal / full throughput per round "
            f"{', '.join(f'{x:.2f}' for x in rate)} (median {statistics.median(rate):.2f}); "
            f"API CPU per job minimal / full {', '.join(f'{x:.2f}' for x in cpu)}",
            flush=True,
        )
    return out
