# Issue 16's retention measure: the claim's cost with a small live queue, then with 1,000,000
# finished jobs beside it, then after the pruner deleted them. Apart from run.py because it is
# jobs_trio alone (the peers' pruners are their own business) and drives the driver directly.
"""Claim cost before and after a million finished jobs accumulate, and after a prune.

    python bench/retention.py                       # PostgreSQL and SQLite, 1,000,000 finished
    python bench/retention.py --finished 200000 --driver sqlite
    python bench/retention.py --finished 1000 --rounds 50   # a smoke run (tests/bench)

For each driver: a fresh database; LIVE ready jobs; the claim measured (--rounds claims of one
job, 500 by default, each settled Complete at once, as a worker at c=1 would: the median and p99
of the claim call alone); then N completed jobs two days old written by one INSERT ... SELECT
(generate_series on PostgreSQL, a recursive CTE on SQLite), ANALYZE, the claim measured again;
then ``jobs-trio prune``'s loop (Retention(keep_finished=1 day), 1,000 a batch) timed, ANALYZE
(what autovacuum does), the claim measured a third time. PostgreSQL at $BENCH_PG (default
postgresql://postgres@127.0.0.1:5432)."""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from common import own_database, pg_execute

from jobs_trio import Retention, open_driver
from jobs_trio._core.records import Complete, NewJob, new_job_id
from jobs_trio._retention.pruner import prune_all

ADMIN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
LIVE = 2_000
ROUNDS = 500
WARMUP = 50
DAY = 86_400.0

PG_FILL = """
INSERT INTO jobs_trio.jobs (id, name, queue, state, payload, priority, attempts, max_attempts,
    run_at, created_at, updated_at, result)
SELECT md5(g::text) || 'f', 'bench.done', 'default', 'completed', '{}', 0, 1, 3,
    $1::float8, $1::float8, $1::float8 + g * 0.001, 'null'
FROM generate_series(1, $2) AS g
"""
SQLITE_FILL = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2)
INSERT INTO jobs (id, name, queue, state, payload, priority, attempts, max_attempts,
    run_at, created_at, updated_at, result)
SELECT printf('%032xf', n), 'bench.done', 'default', 'completed', '{}', 0, 1, 3,
    ?1, ?1, ?1 + n * 0.001, 'null' FROM g
"""


def quantiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):.3f} ms, p99 {p99:.3f} ms"


async def claim_cost(url: str) -> str:
    async with open_driver(url) as driver:
        spent = []
        for _ in range(ROUNDS + WARMUP):
            started = time.perf_counter()
            [claim] = await driver.claim(["default"], 1, lease=30.0, worker_id="bench")
            spent.append(time.perf_counter() - started)
            await driver.settle([Complete(claim.lease)])
        return quantiles(spent[WARMUP:])  # the first claims warm the connection and caches


async def enqueue_live(url: str) -> None:
    async with open_driver(url) as driver:
        jobs = [
            NewJob(new_job_id(), "bench.live", "default", "{}", max_attempts=3) for _ in range(LIVE)
        ]
        await driver.enqueue(jobs)


def sqlite_execute(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    import sqlite3

    with sqlite3.connect(path) as conn:
        for sql, args in statements:
            conn.execute(sql, args)


async def fill(url: str, path: Path | None, n: int) -> None:
    """N completed jobs two days old, then fresh planner statistics."""
    two_days_ago = time.time() - 2 * DAY
    if path is not None:
        sqlite_execute(path, (SQLITE_FILL, (two_days_ago, n)), ("ANALYZE", ()))
    else:
        await pg_execute(url, (PG_FILL, (two_days_ago, n)), ("VACUUM ANALYZE jobs_trio.jobs", ()))


async def analyze(url: str, path: Path | None) -> None:
    if path is not None:
        sqlite_execute(path, ("ANALYZE", ()))
    else:
        await pg_execute(url, ("VACUUM ANALYZE jobs_trio.jobs", ()))


async def prune(url: str) -> tuple[int, float]:
    async with open_driver(url) as driver:
        turn = Retention(keep_finished=DAY).turn("bench", every=0.0)
        started = time.perf_counter()
        deleted = await prune_all(driver, turn)
        return deleted or 0, time.perf_counter() - started


async def one(kind: str, finished: int, workdir: Path) -> None:
    with contextlib.ExitStack() as stack:
        path: Path | None = None
        if kind == "sqlite":
            path = workdir / "retention.db"
            url = f"sqlite:///{path}"
        else:
            url = stack.enter_context(own_database(ADMIN, "bench_retention"))
            cli = Path(sys.executable).parent / "jobs-trio"
            subprocess.run([cli, "migrate", "--db", url], check=True)
        await enqueue_live(url)
        await analyze(url, path)  # every measure below starts from planner statistics
        print(f"{kind}: claim, {LIVE:,} live jobs:                 {await claim_cost(url)}")
        started = time.perf_counter()
        await fill(url, path, finished)
        spent = time.perf_counter() - started
        print(f"{kind}: ({finished:,} finished jobs written in {spent:.1f} s)")
        print(f"{kind}: claim, + {finished:,} finished jobs:      {await claim_cost(url)}")
        deleted, spent = await prune(url)
        rate = deleted / spent
        print(f"{kind}: pruned {deleted:,} in {spent:.1f} s ({rate:,.0f} jobs/s, 1,000 a batch)")
        await analyze(url, path)
        print(f"{kind}: claim, after the prune:              {await claim_cost(url)}")


async def main(args: argparse.Namespace) -> None:
    global ROUNDS
    ROUNDS = args.rounds  # fewer for a smoke run: 500 are ~2 s a measure on PostgreSQL
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.driver:
            await one(kind, args.finished, Path(tmp))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--driver", action="append", choices=["postgres", "sqlite"])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="claims timed per measure")
    parsed = parser.parse_args()
    parsed.driver = parsed.driver or ["postgres", "sqlite"]
    trio.run(main, parsed)
