"""Every SQL statement of app/db written out whole, as PostgreSQL receives it, to sql/<module>.sql (`make sql`)."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import app.db

# Most statements are f-strings composed from shared fragments (JOB_COLUMNS, RUNNING, ...): read in their
# module, a statement is a list of names. Rendered, it is what runs, and grep finds it.
HEADER = "-- Rendered from app/{module}.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.\n"
# What a statement starts with, once its comments are gone; fragments start with a column, a paren, a CTE.
_STATEMENT = re.compile(r"(SELECT|WITH|INSERT|UPDATE|DELETE|COPY|CREATE|ALTER|DROP|SET|LOCK|NOTIFY|VACUUM|ANALYZE)\b")
_COMMENT = re.compile(r"--[^\n]*")
_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")


def is_statement(text: str) -> bool:
    return bool(_STATEMENT.match(_COMMENT.sub("", text).lstrip()))


def _assigned_names(module: ModuleType) -> list[str]:
    """The module's own UPPER_CASE names (assigned at its top level, not imported from another module)."""
    names = []
    for node in ast.parse(inspect.getsource(module)).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names += [t.id for t in targets if isinstance(t, ast.Name) and _CONSTANT.fullmatch(t.id)]
    return names


def statements(module: ModuleType) -> dict[str, str]:
    """Name -> statement, for every statement constant of the module and every statement in a dict of them
    (named `NAME['key']`)."""
    found: dict[str, str] = {}
    for name in _assigned_names(module):
        value = getattr(module, name)
        if isinstance(value, str) and is_statement(value):
            found[name] = value
        elif isinstance(value, dict) and value and all(isinstance(v, str) and is_statement(v) for v in value.values()):
            found.update({f"{name}[{key!r}]": text for key, text in value.items()})
    return found


def render() -> dict[str, str]:
    """File name -> contents, one file per module of app.db that holds a statement, found by walking the
    package (a new or moved module needs no list kept by hand)."""
    files = {}
    for info in sorted(pkgutil.iter_modules(app.db.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{app.db.__name__}.{info.name}")
        found = statements(module)
        if found:
            body = "".join(f"\n-- name: {name} --\n{found[name].strip()}\n" for name in sorted(found))
            files[f"{info.name}.sql"] = HEADER.format(module=f"db/{info.name}") + body
    return files


def write(directory: Path) -> None:
    """Write the rendered files and remove those of modules that hold no statement any more."""
    directory.mkdir(parents=True, exist_ok=True)
    files = render()
    for stale in directory.glob("*.sql"):
        if stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        (directory / name).write_text(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m app.db.render", description=__doc__)
    parser.add_argument("--output", type=Path, default=Path("sql"), help="directory to write (default: sql)")
    write(parser.parse_args(argv).output)


if __name__ == "__main__":
    main()
