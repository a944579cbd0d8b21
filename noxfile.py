"""Sessions: `tests` (what CI runs), `lint` (ruff + mypy), `docs` (the site, warnings as
errors), `bench` (measurements, never gating), `faults` (the fault matrix, run by hand)."""

from __future__ import annotations

import shutil
import subprocess

import nox


def _runs(version: str) -> bool:
    # A name on PATH is not an interpreter: pyenv's shims answer for versions that are not
    # installed (and fail when run), and nox fails a session whose interpreter is missing.
    found = shutil.which(f"python{version}")
    if found is None:
        return False
    probe = subprocess.run([found, "-c", "pass"], capture_output=True, check=False)
    return probe.returncode == 0


# Every supported Python this machine really has (3.11 and up); 3.11 alone when none of the
# others runs. CI's machine has 3.11 only.
SUPPORTED = ["3.11", "3.12", "3.13", "3.14"]
PRESENT = [v for v in SUPPORTED if _runs(v)] or ["3.11"]

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(python=PRESENT)
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    # Four pytest workers on two cores: about half of the suite's time is waiting (real worker
    # processes on leases and graces, PostgreSQL round trips), so four keep both cores busy;
    # six were no faster here and made the timing tests' waits the bottleneck. worksteal: the
    # long process tests do not queue up behind one worker. `-- -n 0` runs it serially.
    # The process tests start hundreds of Python workers that import jobs_trio from src/ (an
    # editable install) and the test apps from tests/. Where PYTHONDONTWRITEBYTECODE is set (this
    # machine's shells have it) none of that bytecode is ever on disk, and every start compiled ~80
    # modules again: 70 ms of CPU a process, 15 s of the suite's CPU. Written once here (read
    # whatever the variable says; only writing is off).
    session.run("python", "-m", "compileall", "-q", "src", "tests", silent=True)
    session.run("pytest", "-n", "4", "--dist", "worksteal", *session.posargs)


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("-e", ".[test,lint]")
    session.run("ruff", "check", "src", "tests", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "bench", "noxfile.py")
    session.run("mypy")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """Build the site into site/ with warnings as errors (`-- serve` to preview it)."""
    session.install("-e", ".[docs,dashboard]")
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve")
    else:
        session.run("mkdocs", "build", "--strict", env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """The side-by-side benchmark (bench/run.py; default `all`, which writes bench/RESULTS.md).
    The peers are installed HERE only, never as dependencies of jobs_trio: pgqueuer with uvloop
    (`pgq run` runs on uvloop when it is installed, so PgQueuer is measured as its runner runs
    it), and procrastinate with psycopg[binary] (its PsycopgConnector needs a libpq; the binary
    wheel brings one). Needs PostgreSQL at $BENCH_PG (default postgres@127.0.0.1:5432)."""
    session.install("-e", ".[postgres]", "pgqueuer", "uvloop", "procrastinate", "psycopg[binary]")
    session.run("python", "bench/run.py", *(session.posargs or ["all"]))


@nox.session(python="3.11")
def faults(session: nox.Session) -> None:
    """The fault matrix (tests/faults/matrix.py, docs/faults.md): real workers under faults on
    SQLite and a private PostgreSQL cluster it makes and removes (never the shared server), one
    row a cell, 6-8 minutes. Not a default session. Every cell runs as root with PostgreSQL's
    server binaries and PgBouncer (.ci/install-pgbouncer) installed (the disk-full cell mounts a
    tmpfs); a cell that lacks one is skipped with the reason. Arguments go to the harness:
    `nox -s faults -- --cells 'sqlite/*' --json faults.json`."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "tests.faults.matrix", *session.posargs)
