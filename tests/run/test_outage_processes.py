# An outage in a busy run, in real `jobs-trio worker` processes (issue 32): SQLite's write lock
# held by another process, or PostgreSQL gone (every connection cut, new ones refused), for 2.5
# leases. No body that returned runs again, and the outage costs no job an attempt.
from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.edges_app import short
from tests.conftest import require_postgres
from tests.drivers.test_processes_postgres import fresh_database
from tests.helpers.outage_front import outage_front
from tests.helpers.process_helpers import started, until, worker_processes

pytestmark = pytest.mark.slow

LEASE = 2.0
OUTAGE = 2.5 * LEASE
Outage = Callable[[], Awaitable[None]]


@asynccontextmanager
async def sqlite_store(
    tmp_path: Path,
) -> AsyncIterator[tuple[str, str, Callable[[], Awaitable[None]]]]:
    """The store's URL for the test and for the workers, and an outage: its write lock held by
    another connection (a long write by another process: a backup, a CLI)."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def outage() -> None:
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            conn = sqlite3.connect(tmp_path / "jobs.db", timeout=30, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
            held.set()
            release.wait()
            conn.execute("ROLLBACK")
            conn.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, hold)
            await trio.to_thread.run_sync(held.wait)
            await trio.sleep(OUTAGE)
            release.set()

    yield url, url, outage


@asynccontextmanager
async def postgres_store(tmp_path: Path) -> AsyncIterator[tuple[str, str, Outage]]:
    """The workers reach the database through a front that goes down for the outage."""
    async with fresh_database(require_postgres()) as url, outage_front(url) as front:

        async def outage() -> None:
            front.down()
            await trio.sleep(OUTAGE)
            front.up()

        yield url, front.url, outage


@pytest.mark.parametrize("store", [sqlite_store, postgres_store], ids=["sqlite", "postgres"])
async def test_an_outage_of_2_5_leases_runs_no_finished_body_twice_and_charges_nothing(
    store: Callable[[Path], Any], tmp_path: Path
) -> None:
    returns = tmp_path / "returns"
    env = {"EDGES_RETURNS": str(returns)}
    async with store(tmp_path) as (url, workers_url, outage), open_driver(url) as driver:
        # Short bodies finish during the outage (their results wait to be written); long ones
        # are still running when their leases run out in it (their workers stop them).
        # A few long ones first: they are running whatever the machine's speed when the
        # outage begins, so the rule for a lease that runs out in it is always exercised.
        payloads = [{"seconds": 4.0}] * 10 + [{"seconds": 0.2}] * 150 + [{"seconds": 4.0}] * 10
        job_ids = list(await short.enqueue_many(driver, payloads))
        options = ("--lease", str(LEASE), "--concurrency", "10")
        async with worker_processes(
            "tests.apps.edges_app", tmp_path, workers_url, 2, *options, env=env
        ) as both:
            await started(both)
            await trio.sleep(1.0)  # busy: both workers full
            await outage()

            async def all_completed() -> bool:
                records = [await driver.get(job_id) for job_id in job_ids]
                return all(r is not None and r.state is JobState.COMPLETED for r in records)

            await until("every job to complete", 90, all_completed)
        outputs = "".join(w.output() for w in both)
        ran = Counter(line.split()[0] for line in returns.read_text().splitlines())
        twice = sorted(job_id for job_id, n in ran.items() if n > 1)
        assert not twice, f"{len(twice)} bodies returned twice: {twice[:5]}\n{outputs[-3000:]}"
        charged = []
        for job_id in job_ids:
            r = await driver.get(job_id)
            assert r is not None
            if r.attempts != 1:
                charged.append((job_id, r.attempts, r.last_error))
        assert not charged, f"{len(charged)} jobs charged for the outage: {charged[:3]}"
        assert "jobs.settle.fenced" not in outputs
        assert "jobs.lease.expired" in outputs, outputs[-3000:]  # the hand-back was exercised
