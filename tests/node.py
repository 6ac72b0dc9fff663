"""Node.js for the tests that need it: its version, and the npm packages a directory pins (installed by
`npm ci`, which `make test` runs when npm is on PATH). Without them such a test is skipped, unless
JOBQ_REQUIRE_NODE=1 (CI sets it), when it fails instead."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def node_version() -> int:
    node = shutil.which("node")
    if node is None:
        return 0
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    return int(out.strip().lstrip("v").split(".")[0])


def _missing(why: str) -> None:
    if os.environ.get("JOBQ_REQUIRE_NODE") == "1":
        pytest.fail(f"{why} (JOBQ_REQUIRE_NODE=1)")
    pytest.skip(why)


def require_node() -> None:
    if node_version() < 20:
        _missing("needs Node.js 20 or later on PATH")


def require_npm_packages(directory: Path) -> Path:
    """The directory's node_modules, installed from its package-lock.json; skips (or fails) without."""
    require_node()
    installed = directory / "node_modules" / ".package-lock.json"
    if not installed.exists():
        _missing(f"run `npm ci` in {directory.relative_to(ROOT)} (`make test` does)")
    return directory / "node_modules"


def run(command: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """Run a command; its output, or a failure that shows it."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{output[-20_000:]}"
    return output


TYPESCRIPT_SDK = ROOT / "clients" / "typescript"
_built: list[Path] = []


def typescript_sdk() -> Path:
    """clients/typescript built with tsc into its dist/ (once per test session); its directory."""
    modules = require_npm_packages(TYPESCRIPT_SDK)
    if not _built:
        run([str(modules / ".bin" / "tsc"), "-p", "tsconfig.build.json"], TYPESCRIPT_SDK)
        _built.append(TYPESCRIPT_SDK)
    return TYPESCRIPT_SDK
