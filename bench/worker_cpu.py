# One worker's rate and CPU per job on PostgreSQL, in one process: N no-op jobs enqueued, then
# run at concurrency C. Apart from run.py because its figure is this process's CPU per job,
# which drifts less than wall rates when the machine is lent more or less CPU (compare trees).
"""A worker's jobs/s, its process CPU per job, and the local PostgreSQL server's.

    python bench/worker_cpu.py [--jobs 3000] [--concurrency 1] [--profile FILE]
    python bench/worker_cpu.py --db sqlite:////tmp/w.db ...   # SQLite: a fresh file, removed after
    PYTHONPATH=/old/tree/src python bench/worker_cpu.py ...   # the same, another tree
    python bench/worker_cpu.py --spy FILE ...   # py-spy's raw samples of the worker phase

Enqueues N no-op jobs into a schema of its own (`bench_worker_cpu_<pid>`, dropped at the end), runs
VACUUM ANALYZE, then opens a worker (every default but concurrency) and times from its open to
the last job's start: jobs/s and time.process_time per job (this process only; the kernel's
share of its socket calls included; the garbage collector's share of it shown apart), and the
CPU every process named ``postgres`` on this machine spent meanwhile, per job (where /proc lets
this user read it: 10 ms ticks, so use thousands of jobs). ``--profile FILE`` writes a cProfile
of the worker; ``--spy FILE`` py-spy's raw samples of the same span (bench/cpu_components.py
reads them)."""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio
from common import CollectorTime, postgres_cpu

import jobs_trio
from jobs_trio._cli.logging_flags import configure_logging

# This process's own: the suite's smoke runs of the scripts built on this one (worker_ops.py,
# worker_instructions.py, cpu_targets.py, cpu_components.py) may run at once on one server, and
# on one schema each claimed the other's jobs and waited for its own (a 120 s timeout, then the
# other's DROP SCHEMA under it).
SCHEMA = f"bench_worker_cpu_{os.getpid()}"
registry = jobs_trio.Registry()


async def main(args: argparse.Namespace) -> None:
    all_started = trio.Event()
    started = 0

    @registry.job("bench.worker_cpu", queue="bench_worker_cpu")
    async def noop(ctx: jobs_trio.JobContext, payload: Any) -> None:
        nonlocal started
        started += 1
        if started == args.jobs:
            all_started.set()

    sqlite = args.db.startswith("sqlite:")
    where: dict[str, Any] = {} if sqlite else {"schema": SCHEMA}
    async with jobs_trio.open_driver(args.db, migrate=True, **where) as driver:
        await noop.enqueue_many(driver, [{"i": i} for i in range(args.jobs)])
        if not sqlite:  # SQLite's claim reads through INDEXED BY: no statistics needed
            await driver.bridge.run(  # type: ignore[attr-defined]
                lambda conn: conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs"), what="analyze"
            )
    try:
        async with jobs_trio.open_driver(args.db, **where) as driver:
            profile = cProfile.Profile() if args.profile else None
            # Read before the worker opens its connections: their backends' CPU since they
            # started all counts (a backend that ends before the second read is not seen).
            # Imported before the clock starts: the worker's modules (metrics, cron, the
            # exposition's http.server) are a process's start-up, ~0.1 s of CPU here, which
            # counted ~5 µs a job at 20,000 jobs (cli_worker_cpu.py excludes start-up too).
            open_worker = jobs_trio.open_worker
            server = postgres_cpu()
            collector = CollectorTime()
            spy = _start_spy(args.spy, args.spy_rate, args.spy_all) if args.spy else None
            wall, cpu = time.perf_counter(), time.process_time()
            if profile:
                profile.enable()
            with collector:
                async with open_worker(
                    driver,
                    registry,
                    concurrency=args.concurrency,
                    drain_on_shutdown=False,
                    **({"claim_ahead": args.ahead} if args.ahead is not None else {}),
                ):
                    await all_started.wait()
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    # Read with the CPU, not after the worker's close: the same span.
                    collected = collector.per_job(args.jobs)
                    after = postgres_cpu()
                    if profile:
                        profile.disable()
                        profile.dump_stats(args.profile)
                    if spy is not None:
                        # py-spy writes its file when interrupted, as at Control-C.
                        spy.send_signal(signal.SIGINT)
                        spy.wait(timeout=60)
        server_share = (
            f", PostgreSQL {(after - server) / args.jobs * 1e6:,.0f} µs"
            if server is not None and after is not None and not sqlite  # no server's share
            else ""
        )
        print(
            f"c={args.concurrency} {args.jobs / wall:,.0f} jobs/s, {cpu / args.jobs * 1e6:,.0f} µs"
            f" CPU a job{server_share}, {collected}"
            f" (load {os.getloadavg()[0]:.2f}; {jobs_trio.__file__})"
        )
    finally:
        await _drop(args.db, sqlite)


def _start_spy(path: str, rate: int, all_threads: bool) -> subprocess.Popen[str]:
    """py-spy recording this process, returned once it samples: before the clock starts, so
    that its attach is not in the span (it pauses the process to read it). The thread holding
    the GIL alone unless ``all_threads``: py-spy counts a thread waiting in
    ``threading.Event.wait`` (the lease lifeline's tick) as running, and a thread that waits
    lets the GIL go. (SQLite's statements run with the GIL let go, but sampling every thread
    pauses the two threads' hand-off of it: its rate fell by two thirds.)"""
    # Beside this interpreter when installed in its environment, not always on PATH.
    beside = Path(sys.executable).with_name("py-spy")
    program = str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")
    command = [program, "record", "--pid", str(os.getpid()), "--rate", str(rate)]
    command += [] if all_threads else ["--gil"]
    spy = subprocess.Popen(
        [*command, "--format", "raw", "--output", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert spy.stdout is not None
    # Its first line ("Sampling process ...") comes once it is attached.
    first = spy.stdout.readline()
    if "Sampling" not in first:
        raise SystemExit(f"py-spy did not start: {first}{spy.stdout.read()}")
    return spy


async def _drop(db: str, sqlite: bool, schema: str = SCHEMA) -> None:
    """The benchmark's store: its SQLite file, or its PostgreSQL schema."""
    if sqlite:
        path = db.removeprefix("sqlite:///")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        return
    async with jobs_trio.open_driver(db, schema=schema) as driver:
        await driver.bridge.run(  # type: ignore[attr-defined]
            lambda conn: conn.execute(f"DROP SCHEMA {schema} CASCADE"), what="drop"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--ahead", type=int, default=None, help="the worker's claim_ahead")
    parser.add_argument("--profile", help="write a cProfile of the worker here")
    parser.add_argument("--spy", help="write py-spy's raw samples of the worker here")
    parser.add_argument("--spy-rate", type=int, default=1000, help="py-spy's samples a second")
    parser.add_argument(
        "--spy-all", action="store_true", help="py-spy: every thread, not the GIL's holder"
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no log lines (default: the CLI's, INFO on stderr: a line per attempt)",
    )
    options = parser.parse_args()
    if not options.quiet:
        configure_logging(argparse.Namespace(log_level="info", log_format="text"))
    trio.run(main, options)
