# The CPU a `jobs-trio worker` process spends a job, run as a user runs it (issue 44): the CLI,
# its log at the default level in the text format, written to a file. Apart from worker_cpu.py
# (a worker inside the measuring process): here the figure is read from /proc, for the process.
"""A `jobs-trio worker` process's CPU a job, from /proc, its stderr written to a file.

    python bench/cli_worker_cpu.py [--db URL] [--jobs 20000] [--concurrency 50]
    PYTHONPATH=/old/tree/src python bench/cli_worker_cpu.py ...   # another tree's

N no-op jobs are enqueued due 3 s from now (--due-in), into a schema of their own
(`bench_cli_worker`, dropped at the end; SQLite: a fresh file, removed after); then `jobs-trio
worker` starts on them (every default but --concurrency; its log, INFO and a line per attempt,
to a file). Its
CPU (utime + stime in /proc/<pid>/stat) is read once it logs `jobs.worker.started`, before the
jobs are due, and again once the database says every job completed: that difference a job is
the figure, start-up excluded. The server's processes' CPU is read the same way."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from common import postgres_cpu, process_cpu

import jobs_trio

SCHEMA = f"bench_cli_worker_{os.getpid()}"  # this process's own, as worker_cpu.py's
JOBS_MODULE = """import jobs_trio

registry = jobs_trio.Registry()


@registry.job("bench.cli", queue="bench_cli")
async def noop(ctx, payload):
    return None
"""
# The jobs are due this long after they are enqueued: the worker starts meanwhile.
DUE_IN = 3.0


async def main(args: argparse.Namespace) -> None:
    sqlite = args.db.startswith("sqlite:")
    where: dict[str, Any] = {} if sqlite else {"schema": SCHEMA}
    folder = Path(tempfile.mkdtemp(prefix="bench_cli_worker_"))
    (folder / "cli_bench_jobs.py").write_text(JOBS_MODULE)
    sys.path.insert(0, str(folder))
    registry: jobs_trio.Registry = importlib.import_module("cli_bench_jobs").registry
    job = registry.require("bench.cli")
    async with jobs_trio.open_driver(args.db, migrate=True, **where) as driver:
        # Never later than the jobs fall due (their due time is counted from the enqueue's
        # own clock read, after this one): the rate's clock starts there or at the worker's
        # start, whichever is later, not a fixed due_in after the worker is up (it is up
        # part-way through due_in, and the rate read the wait it skipped as work done).
        due_at = time.perf_counter() + args.due_in
        await job.enqueue_many(driver, [{"i": i} for i in range(args.jobs)], delay=args.due_in)
        if not sqlite:
            await driver.bridge.run(  # type: ignore[attr-defined]
                lambda conn: conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs"), what="analyze"
            )
    options = [] if sqlite else ["--schema", SCHEMA]
    log = folder / "worker.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), *sys.path[1:]])}
    # As the console script runs (jobs-trio = jobs_trio._cli.console:main), with this tree.
    command = [sys.executable, "-m", "jobs_trio._cli.console", "worker", "cli_bench_jobs:registry"]
    with log.open("wb") as stderr:
        worker = subprocess.Popen(
            [*command, "--db", args.db, *options, "--concurrency", str(args.concurrency)],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        while b"jobs.worker.started" not in log.read_bytes():
            if worker.poll() is not None:
                raise SystemExit(f"the worker exited {worker.returncode}:\n{log.read_text()}")
            await trio.sleep(0.05)
        cpu, server = process_cpu(worker.pid), postgres_cpu()
        began = time.perf_counter()
        async with jobs_trio.open_driver(args.db, **where) as driver:
            while True:
                stats = {q.queue: q for q in await driver.stats()}
                done = stats["bench_cli"].depth.get("completed", 0)
                if done >= args.jobs:
                    break
                await trio.sleep(0.05)
        after, server_after = process_cpu(worker.pid), postgres_cpu()
        wall = time.perf_counter() - max(began, due_at)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        await _drop(args.db, sqlite, where)
    lines = log.read_text().count("jobs.attempt.completed")
    assert cpu is not None and after is not None, "/proc cannot tell this process's CPU"
    server_share = (
        f", PostgreSQL {(server_after - server) / args.jobs * 1e6:,.0f} µs"
        if server is not None and server_after is not None
        else ""
    )
    print(
        f"jobs-trio worker c={args.concurrency}: {(after - cpu) / args.jobs * 1e6:,.0f} µs CPU a"
        f" job{server_share}, {args.jobs / max(wall, 1e-9):,.0f} jobs/s, {lines:,} attempt lines"
        f" logged (load {os.getloadavg()[0]:.2f}; {jobs_trio.__file__})"
    )


async def _drop(db: str, sqlite: bool, where: dict[str, Any]) -> None:
    if sqlite:
        path = db.removeprefix("sqlite:///")
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        return
    async with jobs_trio.open_driver(db, **where) as driver:
        await driver.bridge.run(  # type: ignore[attr-defined]
            lambda conn: conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE"), what="drop"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument(
        "--due-in", type=float, default=DUE_IN, help="seconds until the jobs are due (the start)"
    )
    trio.run(main, parser.parse_args())
