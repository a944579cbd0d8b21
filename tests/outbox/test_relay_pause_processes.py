# A relay PAUSED past its lease (issue 45): a real relay process, through the API and as
# `jobs-trio relay`, on SQLite and PostgreSQL (two databases: a two-step relay), takes 30
# committed outbox rows and is SIGSTOPped before it writes them. Another relay takes the rows
# over once the lease lapsed, a worker runs the 30 jobs and retention prunes them; then the
# paused relay is resumed (SIGCONT). Its write must be refused (`jobs.relay.fenced`): every
# committed row runs once. No hook in the relay: it is held just before its write by the job
# store's lock, which the test takes once the relay's ticket is fresh (relay.py renews it once a
# lease old, and a renewal would wait on the lock before the take instead).
from __future__ import annotations

import collections
import contextlib
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry

import jobs_trio
from jobs_trio._core.metrics import Metrics
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import STALE_TICKET_FLOOR, STALE_TICKET_LEASES
from tests.helpers.process_helpers import JOBS_TRIO, ROOT, stop, until
from tests.outbox.test_relay_kill_processes import Databases, databases, opened

pytestmark = pytest.mark.slow

LEASE = 2.0
ROWS = 30


class Relay:
    """The relay under test: a process with its stderr in a file."""

    def __init__(self, process: trio.Process, log: Path) -> None:
        self.process, self.log = process, log

    def said(self, event: str) -> bool:
        return event in self.log.read_text(errors="replace")


async def spawn(how: str, where: Databases, log: Path) -> Relay:
    if how == "api":
        command = [
            sys.executable,
            "-m",
            "tests.apps.relay_pause_app",
            where.app_url,
            where.app_schema,
            where.jobs_url,
            where.schema,
            str(LEASE),
        ]
    else:
        schemas = []
        if where.app_url.startswith("postgres"):
            schemas = ["--app-schema", where.app_schema, "--schema", where.schema]
        command = [
            *JOBS_TRIO,
            "relay",
            where.app_url,
            where.jobs_url,
            *schemas,
            "--lease",
            str(LEASE),
            "--poll",
            "0.05",
        ]
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stderr=stderr
        )
    return Relay(process, log)


async def newest_ticket_age(store: Driver, where: Databases) -> float | None:
    """How long ago (the store's clock) the newest relay ticket was recorded; None: none yet."""
    sql = "SELECT max(stale_at) FROM {}relay_tickets"
    if where.jobs_url.startswith("sqlite"):
        with contextlib.closing(sqlite3.connect(where.jobs_url[len("sqlite:///") :])) as conn:
            stale_at = conn.execute(sql.format("")).fetchone()[0]
    else:
        async with jobs_trio.transaction(store) as tx:
            stale_at = await tx.fetchval(sql.format(f'"{where.schema}".'))
    if stale_at is None:
        return None
    recorded = stale_at - max(STALE_TICKET_LEASES * LEASE, STALE_TICKET_FLOOR)
    return store.now() - recorded


@contextlib.asynccontextmanager
async def store_locked(store: Driver, where: Databases) -> AsyncIterator[None]:
    """The job store's lock that a relay's write (and ticket) waits on, held for the block."""
    if where.jobs_url.startswith("sqlite"):
        path = where.jobs_url[len("sqlite:///") :]
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        await trio.to_thread.run_sync(conn.execute, "BEGIN IMMEDIATE")
        try:
            yield
        finally:
            await trio.to_thread.run_sync(conn.execute, "ROLLBACK")
            conn.close()
        return
    async with jobs_trio.transaction(store) as tx:
        await tx.execute(f'LOCK TABLE "{where.schema}".relay_tickets IN SHARE MODE')
        yield


@pytest.mark.parametrize("how", ["api", "cli"])
@pytest.mark.parametrize("combination", ["sqlite-two", "postgres-two"])
async def test_a_relay_paused_past_its_lease_is_fenced_and_every_committed_row_runs_once(
    how: str, combination: str, tmp_path: Path
) -> None:
    runs: list[int] = []
    registry = jobs_trio.Registry()

    @registry.job("pause.ship", queue="ship")
    async def ship(ctx: jobs_trio.JobContext, payload: dict[str, int]) -> None:
        runs.append(payload["row"])

    async with (
        databases(combination, tmp_path) as where,
        opened(where) as (app_db, store),
        jobs_trio.open_worker(
            store,
            registry,
            queues=["ship"],
            poll_interval=0.05,
            retention=jobs_trio.Retention(keep_finished=0.2, keep_dead=0.2, every=0.1),
            drain_on_shutdown=False,
        ),
    ):
        relay = await spawn(how, where, tmp_path / "paused-relay.log")
        try:

            async def fresh_ticket() -> bool:
                if relay.process.returncode is not None:
                    pytest.fail(f"the relay exited:\n{relay.log.read_text()}")
                age = await newest_ticket_age(store, where)
                return age is not None and age < LEASE / 4

            await until("the relay to take a fresh ticket", 60, fresh_ticket)
            async with store_locked(store, where):
                outbox = jobs_trio.Outbox(app_db)
                async with jobs_trio.transaction(app_db):
                    for row in range(ROWS):
                        await ship.enqueue(outbox, {"row": row})

                async def held() -> bool:
                    return [h.rows for h in (await app_db.outbox_stats()).held] == [ROWS]

                await until("the relay to take the rows", 10, held)
                # Every thread stopped before the lock is let go: its write thread is held at
                # the lock and must not take it once it is free.
                await stop(relay.process)
            # Paused: once its lease lapses its rows are taken over, run, and pruned.
            taker = jobs_trio.Relay(
                outbox, store, lease=LEASE, metrics=Metrics(CollectorRegistry())
            )

            async def moved() -> bool:
                await taker._one_pass()
                return (await app_db.outbox_stats()).pending == 0

            async def ran_and_pruned() -> bool:
                return len(runs) >= ROWS and await store.list_jobs(limit=1) == []

            await until("the taker to move the rows", LEASE + 20, moved)
            await until("the jobs to run and be pruned", 20, ran_and_pruned)
            relay.process.send_signal(signal.SIGCONT)

            async def woke() -> bool:
                return relay.said("jobs.relay.fenced") or relay.said("jobs.relay.moved")

            await until("the resumed relay's write", 20, woke)

            async def store_empty() -> bool:
                return await store.list_jobs(limit=1) == []

            # Logged after its write: a job it wrote is in the store now, until it ran.
            await until("whatever the resumed relay wrote to run", 20, store_empty)
            counted = collections.Counter(runs)
            assert sorted(counted) == list(range(ROWS))
            assert set(counted.values()) == {1}, f"{len(runs)} runs of {ROWS} rows"
            assert relay.said("jobs.relay.fenced"), relay.log.read_text()
            assert not relay.said("jobs.relay.moved"), relay.log.read_text()
            relay.process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                assert await relay.process.wait() == 0, relay.log.read_text()
        finally:
            if relay.process.returncode is None:
                relay.process.send_signal(signal.SIGCONT)
                relay.process.kill()
            with trio.CancelScope(shield=True):
                await relay.process.wait()
    print(f"\n{how} on {combination}: {ROWS} committed rows -> {len(runs)} runs, each once")
