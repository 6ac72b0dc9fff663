"""The final report: one table per topic (enqueue, drain, latency, memory), jobq beside the raw-SQL limit and
PgQueuer, both ratios, the target (issue 22's table, issue 9's where issue 22 sets none) and whether this run
met it. Targets are set for 64 connections
and judged on the rows of the largest connection count of the run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

Judge = Callable[["Row"], bool | None]


@dataclass
class Row:
    figure: str
    connections: str
    jobq: float | None
    raw: float | None = None
    peer: float | None = None
    unit: str = "jobs/s"
    api_us: float | None = None
    target: str = "-"
    met: bool | None = None
    note: str = ""

    @property
    def vs_raw(self) -> float | None:
        return self.jobq / self.raw if self.jobq is not None and self.raw else None

    @property
    def vs_peer(self) -> float | None:
        return self.jobq / self.peer if self.jobq is not None and self.peer else None

    def judge(self, target: str, test: Judge) -> Row:
        self.target = target
        self.met = test(self)
        return self


def at_least(ratio: float, of: str) -> Judge:
    def test(row: Row) -> bool | None:
        r = row.vs_raw if of == "raw" else row.vs_peer if of == "peer" else row.jobq
        return None if r is None else r >= ratio

    return test


def at_most(limit: float) -> Judge:
    return lambda row: None if row.jobq is None else row.jobq <= limit


def at_most_peer(row: Row) -> bool | None:
    return None if row.jobq is None or row.peer is None else row.jobq <= row.peer


def below_peer(row: Row) -> bool | None:
    return None if row.jobq is None or row.peer is None else row.jobq < row.peer


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "ms":
        return f"{v:.2f} ms"
    if unit in ("µs", "MiB"):
        return f"{v:.0f} {unit}"
    if unit == "x":
        return f"{v:.2f}"
    return f"{v:,.0f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def render(title: str, rows: list[Row]) -> str:
    head = (
        f"\n### {title}\n\n| figure | connections | jobq | raw SQL | PgQueuer | jobq / raw | jobq / PgQueuer "
        "| API CPU per job | target | met |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
    )
    lines = [head]
    for r in rows:
        jobq = r.note if r.jobq is None and r.note else _num(r.jobq, r.unit)
        met = "-" if r.met is None else "yes" if r.met else "**no**"
        lines.append(
            f"| {r.figure} | {r.connections} | {jobq} | {_num(r.raw, r.unit)} | {_num(r.peer, r.unit)} "
            f"| {_ratio(r.vs_raw)} | {_ratio(r.vs_peer)} | {_num(r.api_us, 'µs')} | {r.target} | {met} |"
        )
    return "\n".join(lines)


def as_json(tables: dict[str, list[Row]]) -> dict[str, list[dict[str, Any]]]:
    return {
        topic: [{**asdict(r), "jobq_vs_raw": r.vs_raw, "jobq_vs_pgqueuer": r.vs_peer} for r in rows]
        for topic, rows in tables.items()
    }
