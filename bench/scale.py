# Issue 20's scale bench: 1, 4 and 8 worker processes on one PostgreSQL, jobs_trio beside PgQueuer.
# Apart from run.py because it measures the database's side of a fleet (its transactions, its
# lock waits), not one worker's rate; it reuses run.py's adapters, databases and processes.
"""Total throughput, claim conflicts and transactions per job for a fleet of worker processes.

    python bench/scale.py                                 # 1, 4, 8 processes, c=10 each
    python bench/scale.py --processes 8 --lib pgqueuer --window 10

For each process count, each library (interleaved innermost): a fresh database (dropped after),
JOBS no-op jobs enqueued in batches of 100,000 by the library's own bulk API, VACUUM ANALYZE,
then P worker processes started by the library's adapter (lib_<lib>.py, its best documented
configuration) at concurrency C each. Once every process has started a job, and WARMUP seconds
later, the window opens; over WINDOW seconds it reads:

- jobs/s: completed(t2) - completed(t1) over the span of the completion timestamps (run.py's
  DONE_SQL), while jobs are still waiting;
- pg_stat_database for the bench database (read from the admin database, so the sampling's own
  transactions are not counted): xact_commit, xact_rollback, deadlocks, conflicts;
  transactions per job = (commits + rollbacks) / jobs completed in the window. Statistics reach
  pg_stat_database when a backend goes idle, at most once a second: up to ~1 s of lag at each
  end of the window;
- lock waits: pg_stat_activity sampled every 0.1 s, backends of the bench database waiting on a
  heavyweight lock (wait_event_type = 'Lock': a row or tuple lock another claim holds) —
  the share of samples with any such waiter, and the most seen at once."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import asyncpg  # noqa: E402
from deep_queue import done, enqueue, load1  # noqa: E402

from run import (  # noqa: E402
    ADMIN_URL,
    BenchError,
    Proc,
    _workdir,
    analyze,
    fresh_db,
    read_marks,
    start_worker,
)

STATS_SQL = (
    "SELECT xact_commit, xact_rollback, deadlocks, conflicts FROM pg_stat_database"
    " WHERE datname = $1"
)
COUNTERS = ("xact_commit", "xact_rollback", "deadlocks", "conflicts")
WAITERS_SQL = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'"
)


@contextlib.asynccontextmanager
async def fleet(
    lib: str, url: str, processes: int, conc: int, workdir: Path
) -> AsyncIterator[tuple[list[Proc], list[Path]]]:
    marks = [workdir / f"{lib}-{i}-{time.monotonic_ns()}.marks" for i in range(processes)]
    started = await asyncio.gather(
        *(start_worker(lib, url, conc, "noop", mark, workdir) for mark in marks),
        return_exceptions=True,
    )
    procs = [p for p in started if isinstance(p, Proc)]
    try:
        failed = [e for e in started if isinstance(e, BaseException)]
        if failed:
            raise failed[0]
        yield procs, marks
    finally:
        await asyncio.gather(*(p.stop(30) for p in procs))


async def sample_waiters(admin: asyncpg.Connection, name: str, until: float) -> list[int]:
    seen = []
    while time.monotonic() < until:
        seen.append(int(await admin.fetchval(WAITERS_SQL, name)))
        await asyncio.sleep(0.1)
    return seen


async def cell(
    lib: str, processes: int, conc: int, jobs: int, warmup: float, window: float, workdir: Path
) -> dict[str, Any]:
    async with fresh_db(lib) as url:
        name = url.rsplit("/", 1)[1]
        load_before = load1()
        await enqueue(lib, url, jobs, workdir)
        await analyze(url)
        async with fleet(lib, url, processes, conc, workdir) as (procs, marks):
            deadline = time.monotonic() + 120
            while not all(read_marks(m) for m in marks):
                if time.monotonic() > deadline or any(p.proc.returncode is not None for p in procs):
                    raise BenchError(f"{lib}: not every worker started a job")
                await asyncio.sleep(0.05)
            await asyncio.sleep(warmup)
            admin = await asyncpg.connect(ADMIN_URL, timeout=10)
            try:
                s1 = await admin.fetchrow(STATS_SQL, name)
                c1, t1 = await done(lib, url)
                load_start = load1()
                waiters = await sample_waiters(admin, name, time.monotonic() + window)
                c2, t2 = await done(lib, url)
                s2 = await admin.fetchrow(STATS_SQL, name)
                load_end = load1()
            finally:
                await admin.close()
            if any(p.proc.returncode is not None for p in procs):
                raise BenchError(f"{lib}: a worker exited inside the window")
    if c2 >= jobs or t2 <= t1:
        raise BenchError(f"{lib}: the queue drained inside the window; enqueue more (--jobs)")
    delta = {key: int(s2[key]) - int(s1[key]) for key in COUNTERS}
    done_jobs = c2 - c1
    return {
        "lib": lib,
        "processes": processes,
        "concurrency": conc,
        "jps": done_jobs / (t2 - t1),
        "window_jobs": done_jobs,
        "xact_per_job": (delta["xact_commit"] + delta["xact_rollback"]) / done_jobs,
        **delta,
        "lock_wait_share": sum(1 for w in waiters if w) / len(waiters),
        "lock_wait_max": max(waiters),
        "loads": [load_before, load_start, load_end],
    }


HEADER = (
    "| processes × c | library | jobs/s total | jobs in window | transactions / job |"
    " rollbacks | deadlocks | samples with a lock waiter | most lock waiters at once |"
    " load 1-min (before enqueue / window start / end) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def row(r: dict[str, Any]) -> str:
    loads = "/".join(f"{x:.1f}" for x in r["loads"])
    return (
        f"| {r['processes']} × {r['concurrency']} | {r['lib']} | {r['jps']:,.0f} |"
        f" {r['window_jobs']:,} | {r['xact_per_job']:.2f} | {r['xact_rollback']:,} |"
        f" {r['deadlocks']} | {r['lock_wait_share']:.0%} | {r['lock_wait_max']} | {loads} |"
    )


async def main(args: argparse.Namespace) -> None:
    began = time.monotonic()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, command: {' '.join(sys.argv)}")
    print(HEADER, flush=True)
    results = []
    with _workdir() as workdir:
        for processes in args.processes:
            for lib in args.lib:
                try:
                    result = await cell(
                        lib,
                        processes,
                        args.concurrency,
                        args.jobs,
                        args.warmup,
                        args.window,
                        workdir,
                    )
                except BenchError as exc:
                    print(f"<!-- {lib} × {processes}: {exc} -->", flush=True)
                    continue
                results.append(result)
                print(row(result), flush=True)
    print(f"({(time.monotonic() - began) / 60:.1f} min, {os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lib", action="append", choices=("jobs_trio", "pgqueuer"))
    parser.add_argument("--processes", action="append", type=int, help="default 1, 4, 8")
    parser.add_argument("--concurrency", type=int, default=10, help="per process")
    parser.add_argument("--jobs", type=int, default=150_000, help="waiting at the start")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    args.lib = args.lib or ["jobs_trio", "pgqueuer"]
    args.processes = args.processes or [1, 4, 8]
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
