# jobs_trio.aio and the caller's transactions in real processes (issue 47): a FastAPI-style
# handler on a plain asyncio loop enqueues into SQLite and PostgreSQL on every asyncio path; a
# producer process SIGKILLed between its write and its commit, on every transactional path at
# once, leaves no job and no lock; a Trio worker runs what committed.
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

import jobs_trio
from jobs_trio.testing import new_worker, run_until_idle
from tests.apps.producer_app import AIO_HELD, SYNC_HELD, registry, welcome
from tests.helpers.app_process import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
async def pg_store(postgres_url: str, pg_schema: str) -> AsyncIterator[str]:
    async with jobs_trio.open_driver(
        postgres_url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ):
        yield postgres_url


async def sqlite_store(path: Path) -> str:
    url = f"sqlite:///{path}"
    async with jobs_trio.open_driver(url):
        pass
    return url


async def addresses(url: str, **options: object) -> dict[str, str]:
    """Run every due job with a Trio worker; answer each job's address and final state."""
    async with jobs_trio.open_driver(url, **options) as driver:  # type: ignore[arg-type]
        await run_until_idle(new_worker(driver, registry), wait=False)
        return {
            json.loads(job.payload)["to"]: job.state.value
            for job in await driver.list_jobs(name="signup.welcome")
        }


def app(*argv: str) -> list[str]:
    return [sys.executable, "-m", "tests.apps.producer_app", *argv]


async def test_a_fastapi_style_handler_enqueues_on_every_asyncio_path(
    tmp_path: Path, pg_store: str, pg_schema: str
) -> None:
    lite = await sqlite_store(tmp_path / "jobs.db")
    done = await trio.run_process(
        app("aio-handlers", str(tmp_path / "jobs.db"), pg_store, pg_schema),
        cwd=ROOT,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    ids = json.loads(done.stdout)
    assert await addresses(lite) == {"own@sqlite": "completed", "sqlite3:commit": "completed"}
    assert await addresses(pg_store, schema=pg_schema) == {
        "own@postgres": "completed",
        "asyncpg:commit": "completed",
        "psycopg-async:commit": "completed",
    }
    assert len(ids["sqlite"]) == len(ids["postgres"]) == 1


async def test_a_producer_killed_between_its_write_and_its_commit_leaves_nothing(
    tmp_path: Path, pg_store: str, pg_schema: str
) -> None:
    sqlite_paths = [p for p in (*SYNC_HELD, *AIO_HELD) if "sqlite" in p]
    for name in sqlite_paths:
        await sqlite_store(tmp_path / f"{name}.db")
    with (tmp_path / "app.log").open("wb") as log:
        process = subprocess.Popen(
            app("hold", str(tmp_path), pg_store, pg_schema),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        assert process.stdout is not None
        line = await trio.to_thread.run_sync(process.stdout.readline)
        assert line == b"held\n", (tmp_path / "app.log").read_text()
        # Every path wrote its job inside a transaction it holds open: none can be seen.
        process.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(process.wait)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # Nothing of the killed transactions landed, and no lock outlived them: each store takes a
    # new job at once and a Trio worker runs it.
    for name in sqlite_paths:
        url = f"sqlite:///{tmp_path / name}.db"
        async with jobs_trio.open_driver(url, busy_timeout=1.0) as driver:
            await welcome.enqueue(driver, {"to": f"after@{name}"})
        assert await addresses(url) == {f"after@{name}": "completed"}, name
    async with jobs_trio.open_driver(pg_store, schema=pg_schema, lock_timeout=1.0) as driver:
        await welcome.enqueue(driver, {"to": "after@postgres"}, key="held@psycopg")
    assert await addresses(pg_store, schema=pg_schema) == {"after@postgres": "completed"}
