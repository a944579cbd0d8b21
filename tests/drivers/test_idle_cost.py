# What an idle worker costs PostgreSQL (issue 20): the statements its driver sends in 10 s of
# idling with 1 and with 50 queues, as asyncpg sends them. Apart because it measures real time.
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

from jobs_trio import JobContext, Registry
from jobs_trio._run.worker import Worker
from jobs_trio.drivers._postgres_bridge import Bridge
from jobs_trio.drivers.postgres import PostgresDriver, open_postgres_driver
from tests.drivers.test_postgres_driver import eventually
from tests.helpers.worker_helpers import fresh_metrics

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

pytest.importorskip("trio_asyncio")

IDLE_SECONDS = 5.0

# Counted client-side, not from pg_stat_database: on a shared server the transaction counters
# of an idle database also move by what OTHER sessions do (an idle backend commits a transaction
# to catch up with their catalog changes: ~75 in 10 s here while other tests ran DDL), and
# pg_stat_statements needs a server restart to load. bench/idle_cost.py reports both.


def registry_of(queues: int) -> Registry:
    registry = Registry()

    async def body(ctx: JobContext, payload: Any) -> None:
        return None

    for i in range(queues):
        registry.job(f"idle.job{i}", queue=f"q{i}")(body)
    return registry


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement the driver's connections send from now on (the pool's and LISTEN's)."""
    statements: list[str] = []
    connect = Bridge.connect

    async def counting(self: Bridge, *, purpose: str, **options: Any) -> Any:
        conn = await connect(self, purpose=purpose, **options)
        conn.add_query_logger(lambda record: statements.append(record.query))
        return conn

    monkeypatch.setattr(Bridge, "connect", counting)
    yield statements


async def idle_statements(
    driver: PostgresDriver, sent: list[str], queues: int
) -> tuple[list[str], list[str]]:
    """The statements of a worker's start (up to its first look at the next due time) and of
    the ``IDLE_SECONDS`` after it, with the worker's defaults (stats every 15 s, LISTEN, the
    safety poll)."""
    worker = Worker(driver, registry_of(queues), metrics=fresh_metrics())
    sent.clear()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)

        async def idle() -> bool:
            await trio.lowlevel.checkpoint()
            # next_due: the claim loop's wait began; queue_pauses: the watch on the paused
            # queues looked once and waits (for a NOTIFY). And the start's other statements
            # are over: the first fleet_stats read runs beside the claim loop in a
            # transaction, whose COMMIT, on a slow day, came after the look and inside the
            # window. The stats turn and the prune turn run beside the claim loop, and on a
            # loaded machine (the suite beside two busy loops) began after its wait did: with
            # 1 queue they fell after the start (6 statements against 50 queues' 12), so the
            # start waits for their first statements too; likewise the watch's second look and
            # the presence write, seen in the window at load 7.
            opened = sum(s.startswith("BEGIN") for s in sent)
            ended = sum(s.startswith(("COMMIT", "ROLLBACK")) for s in sent)
            # The watch looks twice: its first look (no epoch seen yet) answers at once, the
            # second finds the same epoch and waits. The worker's presence is written beside.
            # Counted by the look's own text: the claim and the next-due look name queue_pauses
            # too, and counting them let a loaded run take the start before the watch's looks
            # (CI saw both looks fall in the window).
            looked = sum("pause_epoch AS e" in s for s in sent) >= 2
            marks = (
                "The earliest moment",
                "one worker per interval",
                "one prune turn",
                "WITH forgotten AS",
            )
            begun = all(any(mark in s for s in sent) for mark in marks)
            return begun and looked and opened == ended

        await eventually(idle)
        start = list(sent)
        await trio.sleep(IDLE_SECONDS)  # the measurement's window, not a wait for a race
        window = sent[len(start) :]
        await worker.stop()
    return start, window


async def test_an_idle_worker_sends_the_same_few_statements_with_50_queues_as_with_1(
    postgres_url: str, pg_schema: str, sent: list[str]
) -> None:
    async with open_postgres_driver(
        postgres_url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ):
        # A driver of its own for each, so its LISTEN ping (30 s after it opens) stays out
        # of the window. The fleet_stats turn is the schema's: the second worker reads what
        # the first one stored (one statement where the first spent three).
        async with open_postgres_driver(postgres_url, schema=pg_schema) as driver:
            one_start, one_window = await idle_statements(driver, sent, 1)
        async with open_postgres_driver(postgres_url, schema=pg_schema) as driver:
            fifty_start, fifty_window = await idle_statements(driver, sent, 50)

    # Before issue 20 each queue had its own loop: a claim and a next-due look every second,
    # 2 statements/s per queue (about 20 with 1 queue and 1,000 with 50 in this window). Now
    # one claim and one next-due look for all queues start the wait, then LISTEN and a 30 s
    # safety poll: the window holds nothing (the stats read comes at 15 s, the LISTEN ping at
    # 30 s), whatever the number of queues.
    assert len(fifty_start) <= len(one_start), (one_start, fifty_start)
    assert fifty_window == [] and one_window == [], (one_window, fifty_window)
