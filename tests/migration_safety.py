"""What a migration may do to a live database (docs/deployment.md#rolling-upgrades), checked statement by
statement without running it: nothing that holds a lock stopping enqueues or claims on a big table for more
than a moment (a table rewrite, a full scan under an exclusive lock, an index built without CONCURRENTLY,
a backfill in the migration's transaction), and nothing that breaks the previous release, which keeps
serving on the migrated schema while replicas are replaced one by one (a column or table dropped or
renamed).

A statement the check refuses wrongly (say, SET NOT NULL after a validated CHECK (c IS NOT NULL), which
PostgreSQL 12+ applies without a scan) passes when a comment `-- jobq: reviewed: <why>` stands in it or
right before it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from app.db.migrate import _NO_TRANSACTION, _SQL_TOKEN, Migration

LAST_RELEASED = 16  # the last migration of the previous release (1.1.0): every later file is checked
BIG_TABLES = frozenset({"jobs", "job_dependencies", "queue_stats"})  # grow with the jobs; others stay small
REVIEWED = re.compile(r"--\s*jobq:\s*reviewed:\s*\S")

_NAME = r'(?:ONLY\s+)?(?:"?\w+"?\.)?"?(\w+)"?'
_BACKFILL = r"(?:UPDATE|DELETE\s+FROM|INSERT\s+INTO|TRUNCATE(?:\s+TABLE)?|LOCK(?:\s+TABLE)?)\s+"
# Functions whose value differs per row: a column added with one as its default is written into every row.
_VOLATILE = re.compile(
    r"\b(?:clock_timestamp|timeofday|random|gen_random_uuid|uuid_generate_v[14]\w*|nextval|txid_current|"
    r"pg_current_xact_id)\s*\(",
    re.I,
)


@dataclass(frozen=True)
class Statement:
    text: str  # comments gone, whitespace collapsed
    reviewed: bool


Say = Callable[[Statement, str], None]


def statements(sql: str) -> list[Statement]:
    """The statements of a file, each with whether a `-- jobq: reviewed:` comment stands in or before it."""
    found: list[Statement] = []
    parts: list[str] = []
    reviewed = False
    for m in _SQL_TOKEN.finditer(sql):
        token = m.group(0)
        if token == ";":
            text = re.sub(r"\s+", " ", "".join(parts)).strip()
            if text:
                found.append(Statement(text, reviewed))
            parts, reviewed = [], False
        elif token.startswith("--") or token.startswith("/*"):
            reviewed = reviewed or bool(REVIEWED.match(token))
            parts.append(" ")
        else:
            parts.append(token)
    text = re.sub(r"\s+", " ", "".join(parts)).strip()
    if text:
        found.append(Statement(text, reviewed))
    return found


def tables_created(sql: str) -> set[str]:
    return {
        m.group(1).lower()
        for s in statements(sql)
        if (m := re.match(r"CREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?" + _NAME, s.text, re.I))
    }


def problems(migration: Migration, existing: set[str]) -> list[str]:
    """What is wrong with one file, given the tables earlier files created; [] when nothing."""
    found: list[str] = []
    transactional = migration.transactional
    new_here = tables_created(migration.sql)
    old = existing - new_here
    big = old & BIG_TABLES

    def say(statement: Statement, why: str) -> None:
        found.append(f"{migration.name}: {why}: {statement.text[:120]}")

    for st in statements(migration.sql):
        if st.reviewed:
            continue
        text = st.text
        if m := re.match(r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)?(.*?)\bON\s+" + _NAME, text, re.I):
            table = m.group(3).lower()
            if m.group(1) is None and table in big:
                say(st, f"an index on {table} built without CONCURRENTLY stops its writes for the whole build")
            if m.group(1) and transactional:
                say(st, f"CONCURRENTLY cannot run in a transaction: start the file with `{_NO_TRANSACTION}`")
            if m.group(1) and not re.match(r"IF\s+NOT\s+EXISTS\b", m.group(2), re.I):
                say(st, "a concurrent build must say IF NOT EXISTS (a stopped run starts the file again)")
        if m := re.match(r"ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?" + _NAME + r"\s+(.*)$", text, re.I | re.S):
            table, actions = m.group(1).lower(), m.group(2)
            for action in _top_level_parts(actions) if table in old else ():
                if re.match(r"DROP\s+(?!CONSTRAINT\b)", action, re.I):
                    say(st, f"dropping a column of {table} breaks the previous release, which still reads it")
                if re.match(r"RENAME\b", action, re.I):
                    say(st, f"renaming in {table} breaks the previous release, which still uses the old name")
            if table in big:
                _big_table_actions(st, table, actions, say)
        dropped = re.match(r"DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?" + _NAME, text, re.I)
        if dropped and dropped.group(1).lower() in old:
            say(st, f"dropping {dropped.group(1)} breaks the previous release, which still uses it")
        written = re.match(_BACKFILL + _NAME, text, re.I)
        if written and written.group(1).lower() in big:
            say(st, f"a backfill or lock of {written.group(1)} in a migration holds its rows (or the table) for "
                "the whole statement: do it in batches from the service")  # fmt: skip
        if re.match(r"VACUUM\s+(?:\(\s*)?FULL\b|CLUSTER\b|REINDEX\s+(?!.*\bCONCURRENTLY\b)", text, re.I):
            say(st, "VACUUM FULL, CLUSTER and REINDEX without CONCURRENTLY lock their table for the whole run")
    return found


_ADD_COLUMN = re.compile(r"ADD\s+(?!CONSTRAINT\b)(?!CHECK\b)(?!UNIQUE\b)(?!PRIMARY\b)(?!FOREIGN\b)(?!EXCLUDE\b)", re.I)
_ADD_CHECK = re.compile(r"ADD\s+(?:CONSTRAINT\s+\S+\s+)?(?:CHECK|FOREIGN\s+KEY)\b", re.I)
_ADD_UNIQUE = re.compile(r"ADD\s+(?:CONSTRAINT\s+\S+\s+)?(?:UNIQUE|PRIMARY\s+KEY|EXCLUDE)\b", re.I)


def _big_table_actions(st: Statement, table: str, actions: str, say: Say) -> None:
    for action in _top_level_parts(actions):
        if _ADD_COLUMN.match(action):
            if re.search(r"\bDEFAULT\b", action, re.I) and _VOLATILE.search(action):
                say(st, f"a column added to {table} with a volatile default rewrites every row")
            if re.search(r"\b(?:small|big)?serial\b|\bGENERATED\b", action, re.I):
                say(st, f"a serial, identity or generated column added to {table} rewrites every row")
        if _ADD_CHECK.match(action) and not re.search(r"\bNOT\s+VALID\s*$", action, re.I):
            say(st, f"a constraint added to {table} without NOT VALID scans it under a lock that stops writes: "
                "add it NOT VALID, then VALIDATE CONSTRAINT in a later statement")  # fmt: skip
        if _ADD_UNIQUE.match(action) and not re.search(r"\bUSING\s+INDEX\b", action, re.I):
            say(st, f"a unique key added to {table} builds its index under a lock that stops writes: build it "
                "CONCURRENTLY, then ADD ... USING INDEX")  # fmt: skip
        if re.match(r"ALTER\s+(?:COLUMN\s+)?\S+\s+SET\s+NOT\s+NULL\b", action, re.I):
            say(st, f"SET NOT NULL on {table} scans it under a lock that stops writes")
        if re.match(r"ALTER\s+(?:COLUMN\s+)?\S+\s+(?:SET\s+DATA\s+)?TYPE\b", action, re.I):
            say(st, f"changing a column's type on {table} rewrites it under a lock that stops writes")
        if re.match(r"SET\s+(?:LOGGED|UNLOGGED|TABLESPACE|ACCESS\s+METHOD)\b", action, re.I):
            say(st, f"{action.split()[1]} rewrites {table} under a lock that stops writes")


def _top_level_parts(actions: str) -> list[str]:
    """ALTER TABLE's actions, split on commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in actions:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def check(migrations: list[Migration], first_checked: int = LAST_RELEASED + 1) -> list[str]:
    """Every problem of the files numbered `first_checked` and above, in order."""
    found: list[str] = []
    existing: set[str] = set()
    for m in sorted(migrations, key=lambda m: m.version):
        if m.version >= first_checked:
            found += problems(m, existing)
        existing |= tables_created(m.sql)
    return found
