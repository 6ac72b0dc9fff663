"""Deployment files. No Docker engine runs here, so compose.yaml is checked against the Compose
Specification's JSON schema, and the Dockerfile's own install and start commands are run for real."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest
import yaml

from app.settings import Settings
from tests.processes import ServeProcess, jobq_env
from tests.support import migrate_output

# The Dockerfile's commands and compose.yaml's schema: nothing here depends on the major.
# CI runs this file on its first major only (JOBQ_SKIP_ONE_MAJOR).
pytestmark = pytest.mark.one_major

ROOT = Path(__file__).parent.parent
SCHEMA = Path(__file__).parent / "compose-spec" / "compose-spec.json"


# -- Dockerfile ---------------------------------------------------------------------------------------------


def dockerfile() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), ARG defaults substituted."""
    lines: list[str] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        pending += raw.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        lines.append(pending.strip())
        pending = ""
    args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest.strip())
        if instruction == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif instruction == "FROM":
            stages.append([(instruction, rest)])
        else:
            stages[-1].append((instruction, rest))
    return stages


def _one(stage: list[tuple[str, str]], instruction: str) -> str:
    found = [rest for name, rest in stage if name == instruction]
    assert len(found) == 1, (instruction, found)
    return found[0]


def _env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, rest in stage:
        if name == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_dockerfile_is_multi_stage_slim_unprivileged_with_a_healthcheck() -> None:
    stages = dockerfile()
    assert len(stages) >= 2
    for stage in stages:
        assert re.fullmatch(r"python:3\.(1[2-9])-slim( AS \w+)?", stage[0][1]), stage[0]
    final = stages[-1]
    assert any(name == "COPY" and rest.startswith("--from=") for name, rest in final), "final stage copies the build"
    assert not any(name == "RUN" and "pip" in rest for name, rest in final), "nothing is built in the final stage"
    user = _one(final, "USER")
    assert user not in ("root", "0"), user
    assert json.loads(_one(final, "HEALTHCHECK").split("CMD", 1)[1]) == ["jobq", "healthcheck"]
    assert json.loads(_one(final, "CMD")) == ["jobq", "serve"]
    env = _env(final)
    assert _one(final, "EXPOSE") == env["JOBQ_PORT"]
    Settings(**{k.removeprefix("JOBQ_").lower(): v for k, v in env.items() if k.startswith("JOBQ_")})


@pytest.mark.slow
def test_the_image_commands_install_a_working_jobq(tmp_path: Path, empty_database_url: str) -> None:
    """The build stage replayed outside Docker: its COPY lines into a fresh context, its RUN lines (with
    /opt/jobq moved under tmp_path) on this Python; then the final stage's CMD and HEALTHCHECK with its
    ENV. Proves the wheel carries the migrations and the dashboard's files (app/http/ui/), and that
    `jobq migrate` and `jobq serve` work from it."""
    build, final = dockerfile()[0], dockerfile()[-1]
    context = tmp_path / "src"
    context.mkdir()
    for name, rest in build:
        if name == "COPY":
            *sources, dest = rest.split()
            for source in sources:
                target = context / dest / Path(source).name if dest.endswith("/") else context / dest
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(ROOT / source, target)
    prefix = tmp_path / "opt-jobq"
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    for name, rest in build:
        if name == "RUN":
            command = rest.replace("/opt/jobq", str(prefix))
            r = subprocess.run(command, shell=True, cwd=context, env=jobq_env(PATH=path), capture_output=True,
                               text=True, timeout=600, check=False)  # fmt: skip
            assert r.returncode == 0, r.stdout + r.stderr

    python, jobq = str(prefix / "bin" / "python"), str(prefix / "bin" / "jobq")
    where = subprocess.run([python, "-c", "from app.db import migrate; print(migrate.migrations_dir())"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(prefix) and (Path(where) / "0001_jobs.sql").is_file(), where
    ui = subprocess.run([python, "-c", "from importlib import resources; print(resources.files('app.http') / 'ui')"],
                        cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert Path(ui).is_relative_to(prefix), ui
    assert sorted(p.name for p in Path(ui).iterdir()) == ["app.css", "app.js", "index.html"]  # the dashboard

    env = {**_env(final), "PATH": str(prefix / "bin") + os.pathsep + os.environ["PATH"]}
    env.update(JOBQ_HOST="127.0.0.1", JOBQ_DATABASE_URL=empty_database_url)  # the image listens on 0.0.0.0
    r = subprocess.run([jobq, "migrate"], env=jobq_env(**env), capture_output=True, text=True, check=False)
    assert (r.returncode, r.stdout.strip()) == (0, migrate_output(empty_database_url)), r.stderr

    cmd = json.loads(_one(final, "CMD"))
    srv = ServeProcess(log=tmp_path / "serve.log", env=env, command=[str(prefix / "bin" / cmd[0])], cwd=tmp_path)
    try:
        srv.wait_ready()
        assert srv.enqueue(payload="from the image's install").get("id")
        check = json.loads(_one(final, "HEALTHCHECK").split("CMD", 1)[1])
        probe_env = jobq_env(**{**env, "JOBQ_PORT": str(srv.port)})
        r = subprocess.run([str(prefix / "bin" / check[0]), *check[1:]], env=probe_env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert srv.stop() == 0
    finally:
        srv.close()
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT count(*) FROM jobq.jobs").fetchone() == (1,)


# -- compose.yaml -------------------------------------------------------------------------------------------


SECRET = "s" * 32  # what an operator sets for a variable compose.yaml requires (${VAR:?message})


def _interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with the variable unset, and ${VAR:?message} with it set."""
    return re.sub(r"\$\{\w+:\?[^}]*\}", SECRET, re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value))


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def test_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    doc = _compose()
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, errors
    broken = copy.deepcopy(doc)
    broken["services"]["jobq"]["depends_on"]["postgres"]["condition"] = "healthy"
    assert not validator.is_valid(broken), "the schema should refuse an unknown depends_on condition"


def test_compose_has_no_default_secret() -> None:
    """Every use of a secret is ${VAR:?message}: compose refuses to start without it, rather than run on a
    password everyone knows."""
    text = (ROOT / "compose.yaml").read_text()
    for secret in ("POSTGRES_PASSWORD", "JOBQ_API_KEY"):
        uses = re.findall(rf"\$\{{{secret}([^}}]*)\}}", text)
        assert uses and all(use.startswith(":?") for use in uses), (secret, uses)


def test_compose_runs_jobq_after_a_healthy_postgres_18() -> None:
    services = _compose()["services"]
    pg, app = services["postgres"], services["jobq"]
    assert pg["image"] == "postgres:18"
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert app["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert app["build"] == "."

    env = {k: _interpolate(str(v)) for k, v in app["environment"].items()}
    settings = Settings(**{k.removeprefix("JOBQ_").lower(): v for k, v in env.items()})  # valid values
    info = psycopg.conninfo.conninfo_to_dict(settings.database_url)
    pg_env = {k: _interpolate(str(v)) for k, v in pg["environment"].items()}
    assert (info["host"], info["user"], info["password"], info["dbname"]) == (
        "postgres", pg_env["POSTGRES_USER"], pg_env["POSTGRES_PASSWORD"], pg_env["POSTGRES_DB"],
    )  # fmt: skip

    assert settings.api_key is not None, "jobq listens on 0.0.0.0 in its container: it needs a key"
    image_port = _env(dockerfile()[-1])["JOBQ_PORT"]
    assert all(str(p).endswith(f":{image_port}") for p in app["ports"])
    grace = re.fullmatch(r"(\d+)s", app["stop_grace_period"])
    assert grace and int(grace.group(1)) > settings.graceful_timeout_seconds
    declared = set(_compose()["volumes"])
    used = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert used <= declared
