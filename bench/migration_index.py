# A migration that builds an index on a large jobs table while the fleet runs (issue 49): does
# the fleet stall while it builds? Apart because it measures a deploy, not throughput: the
# enqueues that failed and the completions a second during the build, against those before it.
"""A migration building an index on a large jobs table, with a worker and an enqueuer running.

    python bench/migration_index.py                          # PostgreSQL and SQLite, 1,500,000
    python bench/migration_index.py --jobs 200000 --driver sqlite
    python bench/migration_index.py --jobs 2000 --warmup 0.3  # a smoke run (tests/bench)

For each driver: a fresh database at this release's schema without the index migration
``--migration`` (0018, the unique-key windows' index on jobs) builds: that index dropped and its
record forgotten, as a database of the previous release has it. Then N finished jobs (one in
--keyed holding a key, 4) written by one INSERT ... SELECT, planner statistics, and a worker (c=10)
running with an application enqueuing a job every ``--every`` seconds (the driver's default
lock_timeout and busy_timeout). After ``--warmup`` seconds, this release's migration, timed. The
figures: the enqueues made during it, those that failed (and why), the slowest; the jobs
completed a second before it and during it. PostgreSQL at $BENCH_PG (default
postgresql://postgres@127.0.0.1:5432), in a database of its own dropped after; SQLite in a
temporary folder."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio
from common import own_database, pg_execute

import jobs_trio
from jobs_trio._core.errors import JobsError
from jobs_trio.drivers import _postgres_migrate, _sqlite_migrate
from jobs_trio.drivers._migration_files import read_migrations

ADMIN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
DAY = 86_400.0

PG_FILL = """
INSERT INTO jobs_trio.jobs (id, name, queue, state, payload, priority, attempts, max_attempts,
    run_at, created_at, updated_at, result, key)
SELECT md5(g::text) || 'f', 'bench.done', 'default', 'completed', '{}', 0, 1, 3,
    $1::float8 + g * 0.001, $1::float8 + g * 0.001, $1::float8 + g * 0.001, 'null',
    CASE WHEN g % $3 = 0 THEN 'key-' || g END
FROM generate_series(1, $2) AS g
"""
SQLITE_FILL = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2)
INSERT INTO jobs (id, name, queue, state, payload, priority, attempts, max_attempts,
    run_at, created_at, updated_at, result, key)
SELECT printf('%032xf', n), 'bench.done', 'default', 'completed', '{}', 0, 1, 3,
    ?1 + n * 0.001, ?1 + n * 0.001, ?1 + n * 0.001, 'null',
    CASE WHEN n % ?3 = 0 THEN 'key-' || n END FROM g
"""


@attrs.define
class Fleet:
    """What the worker and the application did, with when (trio.current_time())."""

    completed: list[float] = attrs.field(factory=list)
    enqueued: list[tuple[float, float]] = attrs.field(factory=list)  # (sent, seconds)
    failed: list[tuple[float, str]] = attrs.field(factory=list)  # (sent, code: cause)

    def done_per_second(self, start: float, end: float) -> float:
        return sum(start <= t < end for t in self.completed) / max(end - start, 1e-9)


def index_of(version: int, path: Path | None) -> str:
    """The name of the index migration ``version`` builds, read from its file."""
    folder = "sqlite_migrations" if path is not None else "postgres_migrations"
    [migration] = [m for m in read_migrations(folder) if m.version == version]
    built = re.search(r"INDEX\s+(?:CONCURRENTLY\s+)?(?:IF NOT EXISTS\s+)?(\w+)\s+ON", migration.sql)
    assert built is not None, f"{migration.name} builds no index"
    return built.group(1)


async def prepare(url: str, path: Path | None, jobs: int, keyed: int) -> None:
    """This release's schema, and ``jobs`` finished jobs, one in ``keyed`` holding a key."""
    two_days_ago = time.time() - 2 * DAY
    if path is not None:
        await _sqlite_migrate.migrate(url)
        with sqlite3.connect(path) as conn:
            conn.execute(SQLITE_FILL, (two_days_ago, jobs, keyed))
        with sqlite3.connect(path) as conn:
            conn.execute("ANALYZE")
        return
    await _postgres_migrate.migrate(url)
    await pg_execute(
        url, (PG_FILL, (two_days_ago, jobs, keyed)), ("VACUUM ANALYZE jobs_trio.jobs", ())
    )


async def forget(url: str, path: Path | None, version: int) -> None:
    """Migration ``version``'s index dropped and its record forgotten: the database as the
    previous release left it. Done once the fleet's driver has opened (it checks the schema,
    and on SQLite would apply the migration itself)."""
    index = index_of(version, path)
    if path is not None:
        with sqlite3.connect(path) as conn:
            conn.execute(f"DROP INDEX {index}")
            conn.execute("DELETE FROM schema_history WHERE version = ?", (version,))
        return
    await pg_execute(
        url,
        (f"DROP INDEX jobs_trio.{index}", ()),
        ("DELETE FROM jobs_trio.schema_history WHERE version = $1", (version,)),
    )


async def run_fleet(
    url: str, path: Path | None, args: argparse.Namespace, task_status: Any
) -> None:
    """A worker and an application enqueuing, until cancelled; ``task_status.started(fleet)``
    once both run."""
    fleet = Fleet()
    registry = jobs_trio.Registry()

    @registry.job("bench.work")
    async def work(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
        fleet.completed.append(trio.current_time())

    async with jobs_trio.open_driver(url) as driver:
        await forget(url, path, args.migration)
        async with (
            jobs_trio.open_worker(driver, registry, lifecycle=None, concurrency=10),
            trio.open_nursery() as nursery,
        ):

            async def enqueue() -> None:
                while True:
                    sent = trio.current_time()
                    try:
                        await work.enqueue(driver, {})
                        fleet.enqueued.append((sent, trio.current_time() - sent))
                    except JobsError as exc:
                        fleet.failed.append((sent, f"{exc.code}: {exc.cause[:160]}"))
                    await trio.sleep(max(0.0, sent + args.every - trio.current_time()))

            nursery.start_soon(enqueue)
            # Measured from the worker's first completion: its start on a deep table (the
            # recovery of its claims, the first stats) is not what is measured here.
            while not fleet.completed:
                await trio.sleep(0.05)
            await trio.sleep(args.warmup)
            task_status.started(fleet)


async def one(kind: str, args: argparse.Namespace, workdir: Path) -> None:
    with contextlib.ExitStack() as stack:
        path: Path | None = None
        if kind == "sqlite":
            path = workdir / "migration_index.db"
            url = f"sqlite:///{path}"
        else:
            url = stack.enter_context(own_database(ADMIN, "bench_migration_index"))
        started = time.perf_counter()
        await prepare(url, path, args.jobs, args.keyed)
        spent = time.perf_counter() - started
        print(f"{kind}: {args.jobs:,} finished jobs written in {spent:.1f} s")
        migrate = _sqlite_migrate.migrate if path is not None else _postgres_migrate.migrate
        async with trio.open_nursery() as nursery:
            fleet: Fleet = await nursery.start(run_fleet, url, path, args)
            began = trio.current_time()
            applied = await migrate(url)
            ended = trio.current_time()
            await trio.sleep(args.warmup)
            nursery.cancel_scope.cancel()
        during = [s for t, s in fleet.enqueued if began <= t < ended]
        # Those of the whole run: without a migration, none fails.
        failed = [why for _, why in fleet.failed]
        print(
            f"{kind}: migration {applied} took {ended - began:.2f} s over {args.jobs:,} jobs:"
            f" {len(during)} enqueues during it, slowest {max(during, default=0.0):.2f} s;"
            f" {len(failed)} failed; completed"
            f" {fleet.done_per_second(began - args.warmup, began):.0f}/s before,"
            f" {fleet.done_per_second(began, ended):.0f}/s during,"
            f" {fleet.done_per_second(ended, ended + args.warmup):.0f}/s after"
        )
        for why in sorted(set(failed))[:3]:
            print(f"{kind}:   failed: {why}")


async def main(args: argparse.Namespace) -> None:
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.driver:
            await one(kind, args, Path(tmp))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_500_000)
    parser.add_argument("--keyed", type=int, default=4, help="one job in KEYED holds a key")
    parser.add_argument("--driver", action="append", choices=["postgres", "sqlite"])
    parser.add_argument("--migration", type=int, default=18, help="the index's migration")
    parser.add_argument("--every", type=float, default=0.01, help="seconds between enqueues")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before and after")
    parsed = parser.parse_args()
    parsed.driver = parsed.driver or ["postgres", "sqlite"]
    sys.exit(trio.run(main, parsed))
