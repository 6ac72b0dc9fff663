"""How the commands print: tables and short texts for people, the server's JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any


def print_json(doc: Any, *, compact: bool = False) -> None:
    """A document as the server sent it: indented, or one line (one document per line when watching)."""
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")) if compact else json.dumps(doc, indent=2)
    print(text, flush=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Iterable[int] = ()) -> list[str]:
    """Columns two spaces apart, numbers right-aligned, None as `-`; no trailing blanks."""
    right = set(numeric)
    cells = [list(headers)] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return lines


def print_lines(lines: Iterable[str]) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def duration(seconds: float | None) -> str:
    """A length of time in at most two units: 850ms, 2.4s, 3m12s, 1h04m, 2d03h."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def millis(ms: float | None) -> str:
    return "-" if ms is None else duration(ms / 1000)


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)


def relative(text: str | None, now: datetime | None = None) -> str:
    """An RFC 3339 time as `3m12s ago` or `in 40s` (this host's clock: for reading, never for deciding)."""
    when = parse_time(text)
    if when is None:
        return "-"
    delta = (when - (now or datetime.now(UTC))).total_seconds()
    if abs(delta) < 0.5:
        return "now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


def one_line(text: str | None, width: int) -> str | None:
    """A text on one line, cut to `width` characters (ending in "...")."""
    if text is None:
        return None
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
