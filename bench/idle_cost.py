# What one idle worker costs PostgreSQL with 1 and with 50 queues (issue 20): statements sent,
# the database's transactions, and the worker's own CPU. Apart from run.py (throughput between
# libraries): this measures a worker doing nothing, in this process, on a database of its own.
"""Idle cost of one jobs_trio worker on PostgreSQL.

    python bench/idle_cost.py                     # 1 and 50 queues, 30 s each
    python bench/idle_cost.py --queues 1 10 50 --seconds 60
    PYTHONPATH=/tmp/before/src python bench/idle_cost.py   # another checkout's jobs_trio

Each run: a fresh database (idle_cost_<pid>_<n>, dropped after), migrated and VACUUM ANALYZEd
(else autovacuum's analysis of the new catalogs lands in the window), one worker with the
defaults (stats every 15 s, LISTEN, the safety poll) and no job. Figures:

* statements/s — what the driver's connections send, counted by asyncpg's query logger over the
  window after the worker's first wait began (exact: nothing else is counted);
* transactions/s — pg_stat_database xact_commit + xact_rollback of the database from before
  the driver opens to after it closes, over the window; it includes opening and closing (each
  connection's start counts 2) and, on a shared server, transactions an IDLE backend commits
  to catch up with other sessions' catalog changes (DDL elsewhere): compare with statements;
* worker CPU — this process's CPU time over the window, as % of one core."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any
from urllib.parse import urlparse, urlunparse

import trio
import trio_asyncio

from jobs_trio import JobContext, Registry
from jobs_trio._run.worker import Worker
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers._postgres_bridge import Bridge

ADMIN_URL = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def registry_of(queues: int) -> Registry:
    registry = Registry()

    async def body(ctx: JobContext, payload: Any) -> None:
        return None

    for i in range(queues):
        registry.job(f"idle.job{i}", queue=f"q{i}")(body)
    return registry


class Server:
    """An admin connection to the server's maintenance database."""

    def __init__(self, conn: Any, loop: Any) -> None:
        self.conn = conn
        self.loop = loop

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await trio_asyncio.aio_as_trio(self.conn.fetchval, loop=self.loop)(sql, *args)

    async def execute(self, sql: str) -> None:
        await trio_asyncio.aio_as_trio(self.conn.execute, loop=self.loop)(sql)

    async def settled_transactions(self, database: str) -> int:
        """The database's transactions once no session is left and the count held still for
        a second (a backend's counts are flushed a moment after it leaves pg_stat_activity)."""
        with trio.fail_after(60):
            while await self.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database
            ):
                await trio.sleep(0.1)
            last = -1
            while True:
                now = await self.fetchval(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1",
                    database,
                )
                if now == last:
                    return int(now)
                last = now
                await trio.sleep(1.0)


async def connect(url: str, loop: Any) -> Any:
    import asyncpg

    return await trio_asyncio.aio_as_trio(asyncpg.connect, loop=loop)(url)


async def measure(server: Server, queues: int, seconds: float) -> dict[str, float]:
    name = f"idle_cost_{os.getpid()}_{queues}"
    url = urlunparse(urlparse(ADMIN_URL)._replace(path=f"/{name}"))
    await server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await server.execute(f'CREATE DATABASE "{name}"')
    try:
        async with open_driver(url, migrate=True):
            pass
        inside = await connect(url, server.loop)
        await trio_asyncio.aio_as_trio(inside.execute, loop=server.loop)("VACUUM ANALYZE")
        await trio_asyncio.aio_as_trio(inside.close, loop=server.loop)()
        before = await server.settled_transactions(name)

        sent: list[str] = []
        plain_connect = Bridge.connect

        # Every option passed on as given (the listener asks for its own connection class).
        async def counting(self: Bridge, *, purpose: str, **options: Any) -> Any:
            conn = await plain_connect(self, purpose=purpose, **options)
            conn.add_query_logger(lambda record: sent.append(record.query))
            return conn

        Bridge.connect = counting  # type: ignore[method-assign]
        try:
            async with open_driver(url) as driver:
                worker = Worker(driver, registry_of(queues))
                async with trio.open_nursery() as nursery:
                    await nursery.start(worker.run)
                    with trio.fail_after(30):
                        while not any("The earliest moment" in s for s in sent):
                            await trio.sleep(0.05)  # the worker's first wait began
                    at_start = len(sent)
                    cpu, wall = time.process_time(), time.monotonic()
                    await trio.sleep(seconds)
                    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                    in_window = len(sent) - at_start
                    await worker.stop()
        finally:
            Bridge.connect = plain_connect  # type: ignore[method-assign]
        after = await server.settled_transactions(name)
    finally:
        with trio.CancelScope(shield=True):
            await server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return {
        "queues": queues,
        "seconds": wall,
        "start statements": at_start,
        "statements/s": in_window / wall,
        "transactions/s": (after - before) / wall,
        "worker CPU %": 100 * cpu / wall,
    }


async def main(queue_counts: list[int], seconds: float) -> None:
    async with trio_asyncio.open_loop() as loop:
        conn = await connect(ADMIN_URL, loop)
        server = Server(conn, loop)
        try:
            rows = [await measure(server, n, seconds) for n in queue_counts]
        finally:
            await trio_asyncio.aio_as_trio(conn.close, loop=loop)()
    import jobs_trio

    print(f"jobs_trio from {os.path.dirname(jobs_trio.__file__)}; {seconds:.0f} s idle each")
    print("| queues | statements to start | statements/s | transactions/s | worker CPU |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['queues']} | {row['start statements']:.0f} | {row['statements/s']:.2f} "
            f"| {row['transactions/s']:.2f} | {row['worker CPU %']:.2f}% |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    trio.run(main, args.queues, args.seconds)
