"""What every command family shares: exit codes, messages on stderr, argument types, the help formatter."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable

from pydantic import ValidationError

from app.settings import Settings

# 0 success, 1 runtime failure, 2 bad usage; the HTTP API commands add 3 and 4 (app/runtime/cli/remote.py).
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2

EXIT_CODES = """exit codes:
  0  success (serve: stopped by SIGTERM or SIGINT after a clean shutdown)
  1  runtime failure: database unreachable, migration failed, no PostgreSQL binaries,
     the service failed to start or stopped on its own
  2  bad usage or configuration; the message names the flag or JOBQ_* variable"""


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        for err in exc.errors():
            if err["loc"]:
                name = "JOBQ_" + "_".join(str(p) for p in err["loc"]).upper()
                print(f"jobq: invalid configuration: {name}: {err['msg']}", file=sys.stderr)
            else:  # a rule across variables; its message names them
                print(f"jobq: invalid configuration: {err['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def _fail(message: str, code: int = EXIT_FAILURE) -> int:
    print(f"jobq: {message}", file=sys.stderr)
    return code


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi}")
        return value

    return parse


def _number_in(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not lo <= value <= hi:  # NaN fails this too
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi}")
        return value

    return parse


_seconds = _number_in(0, 3600)


class _Formatter(argparse.HelpFormatter):
    """Wraps each paragraph on its own; keeps indented blocks (exit codes, examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            if "\n  " in para or para.startswith("  "):
                paragraphs.append(para)
            else:
                paragraphs.append(textwrap.fill(" ".join(para.split()), width, initial_indent=indent,
                                                subsequent_indent=indent))  # fmt: skip
        return "\n\n".join(paragraphs)
