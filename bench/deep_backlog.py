# The deep-backlog workload (issue 19): N jobs waiting, then a real `jobs-trio worker` timed over
# a fixed window. Apart from run.py because it measures one thing run.py's batch cannot: how the
# rate holds when the queue is 1,000,000 deep rather than 20,000.
"""Throughput of `jobs-trio worker` with a deep backlog.

    python bench/deep_backlog.py                      # PostgreSQL, 1,000,000 waiting, c=50
    python bench/deep_backlog.py --n 20000
    python bench/deep_backlog.py --db sqlite --n 1000000 --concurrency 10

Enqueues N no-op jobs with `enqueue_many` in batches of 100,000 (as an application would), runs
VACUUM ANALYZE (ANALYZE on SQLite), starts `jobs-trio worker bench.deep_backlog:registry`, and
counts the jobs completed over WINDOW seconds after a WARMUP from the first job's start. The rate
is read from the database's own completion times: completed(t2) - completed(t1) over
max(updated_at)(t2) - max(updated_at)(t1), while the queue is still deep. The database (or file)
is made for the run and dropped after it, also on failure. The load average is printed beside the
figures: this machine is shared."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # as run.py runs the adapters: common.py beside this file

from common import JOB, QUEUE  # noqa: E402

import jobs_trio  # noqa: E402

# The worker's side: the job it runs. No-op, as in the measurement; the first start is
# written to $DEEP_BACKLOG_MARK so the orchestrator times from there (start-up excluded).
registry = jobs_trio.Registry()
_first_written = False


@registry.job(JOB, queue=QUEUE)
async def noop(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    global _first_written
    if not _first_written:
        _first_written = True
        # Written aside, then renamed: the orchestrator reads the mark as soon as it exists, and
        # a file written in place could be read still empty.
        mark = Path(os.environ["DEEP_BACKLOG_MARK"])
        mark.with_suffix(".part").write_text(repr(time.time()))
        mark.with_suffix(".part").replace(mark)


# --- the orchestrator ----------------------------------------------------------------------

BATCH = 100_000
COUNT_PG = (
    "SELECT count(*), max(updated_at) FROM jobs_trio.jobs WHERE state = 'completed'"
)  # fmt: skip
COUNT_SQLITE = "SELECT count(*), max(updated_at) FROM jobs WHERE state = 'completed'"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


@contextlib.asynccontextmanager
async def postgres_db() -> AsyncIterator[str]:
    from run import admin, db_url

    # Our own name (pid): run.py's bench_<lib>_<pid>_<n> may be in use by a run next to this one.
    name = f"bench_deep_{os.getpid()}"
    await admin(f'CREATE DATABASE "{name}"')
    try:
        yield db_url(name)
    finally:
        await asyncio.shield(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextlib.asynccontextmanager
async def sqlite_db() -> AsyncIterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="deep_backlog_"))
    try:
        yield f"sqlite:///{folder / 'jobs.db'}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def enqueue(url: str, n: int, workdir: Path) -> float:
    """N jobs in batches of BATCH, each batch one `enqueue_many` in a process of its own (as
    bench/run.py enqueues); answers the seconds spent."""
    from run import run_once

    spent = 0.0
    for i, start in enumerate(range(0, n, BATCH)):
        size = min(BATCH, n - start)
        args = ["enqueue", "--db", url, "--n", str(size), *(["--install"] if i == 0 else [])]
        answer = await run_once("jobs_trio", args, workdir, "jobs_trio-enqueue", 600)
        spent += float(answer["seconds"])
    return spent


async def analyze(url: str) -> None:
    if url.startswith("sqlite"):
        await asyncio.to_thread(_sqlite, url, "ANALYZE")
        return
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute("VACUUM ANALYZE jobs_trio.jobs")
    finally:
        await conn.close()


def _sqlite(url: str, sql: str) -> Any:
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as conn:
        return conn.execute(sql).fetchone()


async def completed(url: str) -> tuple[int, float]:
    if url.startswith("sqlite"):
        count, last = await asyncio.to_thread(_sqlite, url, COUNT_SQLITE)
    else:
        from run import query_row

        count, last = await query_row(url, COUNT_PG)
    return int(count), float(last or 0.0)


def _python_path() -> str:
    """The repository root (for `bench.deep_backlog:registry`) after any PYTHONPATH given, so
    another checkout's src can be measured the same way."""
    return os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE.parent)) if p)


async def measure(
    url: str, n: int, concurrency: int, warmup: float, window: float, workdir: Path
) -> Any:
    mark = workdir / "first-start"
    log = open(workdir / "worker.log", "wb")  # noqa: SIM115 - closed below, after the process
    cli = shutil.which("jobs-trio") or str(Path(sys.executable).with_name("jobs-trio"))
    proc = await asyncio.create_subprocess_exec(
        cli,
        "worker",
        "bench.deep_backlog:registry",
        "--db",
        url,
        "--concurrency",
        str(concurrency),
        cwd=str(HERE.parent),
        env={**os.environ, "DEEP_BACKLOG_MARK": str(mark), "PYTHONPATH": _python_path()},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker never started a job (exit {proc.returncode})")
            await asyncio.sleep(0.05)
        first = float(mark.read_text())
        await asyncio.sleep(max(0.0, first + warmup - time.time()))
        c1, t1 = await completed(url)
        load1 = load()
        await asyncio.sleep(window)
        c2, t2 = await completed(url)
        load2 = load()
        if proc.returncode is not None:
            raise RuntimeError(f"the worker exited ({proc.returncode}) inside the window")
        # Steady: between the two samples, while the queue was still deep. Overall: from the
        # first start (ramp-up included), for a backlog that drains before the warm-up ends.
        steady = (c2 - c1) / (t2 - t1) if t2 > t1 and c2 < n else None
        return {
            "overall": c2 / (t2 - first) if t2 > first else 0.0,
            "steady": steady,
            "jobs": c2,
            "seconds": t2 - first,
            "loads": (load1, load2),
        }
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


async def main(args: argparse.Namespace) -> None:
    database = postgres_db if args.db == "postgres" else sqlite_db
    with tempfile.TemporaryDirectory(prefix="deep_backlog_work_") as work:
        workdir = Path(work)
        async with database() as url:
            print(f"{args.db}: enqueueing {args.n:,} jobs ({load()})", flush=True)
            spent = await enqueue(url, args.n, workdir)
            print(f"  enqueued in {spent:.1f} s ({args.n / spent:,.0f} jobs/s)", flush=True)
            if args.analyze:
                await analyze(url)
            result = await measure(url, args.n, args.concurrency, args.warmup, args.window, workdir)
            steady = result["steady"]
            print(
                f"  {args.db} c={args.concurrency} depth={args.n:,}: "
                + (f"{steady:,.0f} jobs/s steady over the window, " if steady else "")
                + f"{result['overall']:,.0f} jobs/s from the first start"
                f" ({result['jobs']:,} done in {result['seconds']:.1f} s;"
                f" {result['loads'][0]} -> {result['loads'][1]})",
                flush=True,
            )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--n", type=int, default=1_000_000, help="jobs waiting (default 1e6)")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--warmup", type=float, default=5.0, help="s after the first start")
    parser.add_argument("--window", type=float, default=30.0, help="s counted")
    parser.add_argument(
        "--no-analyze", dest="analyze", action="store_false", help="skip (VACUUM) ANALYZE"
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.concurrency < 1 or args.window <= 0 or args.warmup < 0:
        parser.error("--n and --concurrency must be positive, --window > 0, --warmup >= 0")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
