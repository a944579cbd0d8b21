# The benchmark's orchestrator: fresh databases, worker processes, clocks, and the table.
# Apart from the lib_*.py adapters so it never imports a job library: each library runs in
# processes of its own (trio-asyncio changes asyncio for a whole process, STACK-NOTES).
"""Side-by-side benchmark of jobs_trio, PgQueuer and Procrastinate on one machine.

    python bench/run.py throughput --lib jobs_trio --concurrency 10
    python bench/run.py latency --lib pgqueuer
    python bench/run.py all              # every workload, every library, interleaved, 3 reps

Each run gets a fresh database (bench_<lib>_<pid>_<n>, dropped after, also on failure), one worker
process per library, start-up excluded: processing is timed from the first handler start (the
handler's own clock) to the last completion the database recorded. The batch is followed by
VACUUM ANALYZE, for every library alike (a database that has run for a minute has planner
statistics; autovacuum gives them); `cold` is the same batch without it, on a fresh database."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import itertools
import json
import os
import platform
import re
import shlex
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import asyncpg
from common import postgres_cpu, process_cpu

HERE = Path(__file__).resolve().parent
LIBS = ("jobs_trio", "jobs_trio_ahead", "pgqueuer", "procrastinate")
# jobs_trio's workers at a non-default setting: its own column (its own database, its own
# worker process), beside the default, in the workloads where that setting changes anything.
VARIANTS = {"jobs_trio_ahead": "jobs_trio"}  # column: the library whose tables it uses
VARIANT_WORKLOADS = ("throughput", "latency", "load", "retries", "sqlite")
OURS = ("jobs_trio", *VARIANTS)
ADMIN_URL = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PREFIX = "bench_"

# SQL each library's tables answer (the adapters hold them; run.py never imports a library).
DONE_SQL = {
    "jobs_trio": (
        "SELECT count(*) FILTER (WHERE state = 'completed'),"
        " max(updated_at) FILTER (WHERE state = 'completed') FROM jobs_trio.jobs"
    ),
    "pgqueuer": (
        "SELECT count(*), extract(epoch FROM max(created))::float8 FROM pgqueuer_log"
        " WHERE status = 'successful'"
    ),
    "procrastinate": (
        "SELECT (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),"
        " (SELECT extract(epoch FROM max(at))::float8 FROM procrastinate_events"
        "  WHERE type = 'succeeded')"
    ),
}
# Jobs waiting to be claimed: the load generator holds the backlog under a cap with it.
READY_SQL = {
    "jobs_trio": "SELECT count(*) FROM jobs_trio.jobs WHERE state = 'ready'",
    "pgqueuer": "SELECT count(*) FROM pgqueuer WHERE status = 'queued'",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'",
}
DONE_SQLITE = "SELECT count(*), max(updated_at) FROM jobs WHERE state = 'completed'"
JOB_SQL = {
    "jobs_trio": "SELECT state, attempts FROM jobs_trio.jobs",
    "pgqueuer": (
        "SELECT coalesce((SELECT status::text FROM pgqueuer LIMIT 1),"
        " (SELECT 'gone, logged ' || status::text FROM pgqueuer_log ORDER BY id DESC LIMIT 1)),"
        " (SELECT attempts FROM pgqueuer LIMIT 1)"
    ),
    "procrastinate": "SELECT status::text, attempts FROM procrastinate_jobs",
}
for _sql in (DONE_SQL, READY_SQL, JOB_SQL):
    _sql.update({variant: _sql[lib] for variant, lib in VARIANTS.items()})
# A job in one of these states will not run again: no second worker is waited for.
FINISHED = ("completed", "succeeded", "gone, logged successful")


class Sizes:
    jobs = 10_000  # throughput: jobs enqueued in one batch
    latency_jobs = 200
    latency_gap = 0.03  # s between single enqueues: the worker is idle at each
    sleep = 30.0  # drain/rescue: the job awaits this long
    signal_after = 1.0  # s after the job started
    drain_exit_bound = 40.0  # a peer that waits out its 30 s job still fits
    rerun_bound = 30.0  # drain: second worker ready → job started
    rescue_bound = 45.0  # rescue: SIGKILL → job started on the second worker
    throughput_bound = 300.0
    # Processing is timed over the whole batch or, for a library too slow to finish it on the
    # run's time budget, over the first WINDOW seconds of the same deep queue (said in the table).
    window = 10.0
    cold_concurrency = 10  # the cold-planner workload runs at this concurrency only
    event_reps = 1  # drain and rescue: bounded waits and states, not rates; one repetition
    # Latency under load: a worker at c=50. First fed all it takes (load_offer, 30,000 jobs/s,
    # more than any library here sustains, a tick's order bounded to leave at most twice
    # load_cap waiting, and a tick skipped while more than load_cap wait) for load_ramp s,
    # then its rate read over the next load_calibrate s (until 2026-12-02 it was offered
    # load_rate, 5,000 jobs/s, and a library that sustains more read as 5,000: PgQueuer's
    # 4,995 was that cap; until 2026-12-06 10,000, load_cap a tick, and in a fast hour both
    # libraries read 8,800-9,500, near that cap again); the backlog left drains (to
    # load_cap / 2, load_drain s at most); then fed load_rate or load_share of that
    # rate, whichever is less, every load_tick (lowered by load_share again after each
    # load_settle s in which the queue still reached the cap, load_settle_tries at most), then
    # probe_jobs single enqueues probe_gap apart into the same queue.
    load_concurrency = 50
    load_offer = 30_000.0  # 600 a tick of load_tick, bounded as said above
    load_drain = 20.0
    load_rate = 5_000.0
    load_share = 0.8
    load_tick = 0.02
    load_cap = 200
    load_ramp = 3.0
    load_calibrate = 2.0
    load_settle = 1.0
    load_settle_tries = 4
    probe_jobs = 100
    probe_gap = 0.05
    # Retries: the throughput batch with every fail_every-th job failing its first attempt.
    retry_concurrency = 10
    fail_every = 10
    # Durable steps (jobs_trio only): steps_jobs jobs of 10 no-op step.run each.
    steps_jobs = 1_000
    steps_concurrency = 10
    # Worker memory: rss_jobs queued (the issue asks 200,000; fewer to fit the run's budget,
    # --rss-jobs to change), one worker at rss_concurrency, RSS sampled every rss_every s.
    rss_jobs = 50_000
    rss_concurrency = 50
    rss_every = 0.25


class BenchError(Exception):
    pass


# --- processes ---------------------------------------------------------------------------


class Proc:
    """A bounded child process: stdout read by line, stderr to a log file, always reaped."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path, what: str) -> None:
        self.proc = proc
        self.log = log
        self.what = what

    @classmethod
    async def start(
        cls, lib: str, args: list[str], workdir: Path, what: str, *, stdin: bool = False
    ) -> Proc:
        log = workdir / f"{what}.{time.monotonic_ns()}.log"
        with open(log, "wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE / f"lib_{lib}.py"),
                *args,
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                cwd=str(HERE),
                start_new_session=True,  # our Ctrl-C is ours; we stop the children ourselves
            )
        return cls(proc, log, what)

    async def line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raise BenchError(f"{self.what}: no output within {timeout} s{self.tail()}") from None
        if not raw:
            await self.wait(5)
            raise BenchError(f"{self.what} exited ({self.proc.returncode}){self.tail()}")
        return raw.decode().strip()

    async def result(self, timeout: float) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(await self.line(timeout))
        await self.wait(10)
        return answer

    async def wait(self, timeout: float) -> bool:
        """True when it exited within ``timeout``."""
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def signal(self, signum: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    async def stop(self, grace: float = 10.0) -> None:
        self.signal(signal.SIGTERM)
        if not await self.wait(grace):
            self.signal(signal.SIGKILL)
            await self.wait(10)

    def tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()[-8:]
        except OSError:
            return ""
        return ("\n    " + "\n    ".join(text)) if text else ""


@contextlib.asynccontextmanager
async def running(proc: Proc, *, grace: float = 10.0) -> AsyncIterator[Proc]:
    try:
        yield proc
    finally:
        await proc.stop(grace)


async def run_once(lib: str, args: list[str], workdir: Path, what: str, timeout: float) -> Any:
    proc = await Proc.start(lib, args, workdir, what)
    async with running(proc, grace=1.0):
        return await proc.result(timeout)


async def start_worker(lib: str, url: str, conc: int, kind: str, mark: Path, workdir: Path) -> Proc:
    args = ["worker", "--db", url, "--concurrency", str(conc), "--kind", kind]
    proc = await Proc.start(lib, [*args, "--mark", str(mark)], workdir, f"{lib}-worker")
    try:
        if await proc.line(60) != "ready":
            raise BenchError(f"{lib} worker did not say ready{proc.tail()}")
    except BaseException:
        await proc.stop(1.0)
        raise
    return proc


def read_marks(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


async def wait_for(check: Callable[[], Any], timeout: float, every: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(every)


# --- databases ---------------------------------------------------------------------------

_counter = itertools.count(1)


def db_url(name: str) -> str:
    parsed = urlparse(ADMIN_URL)
    return urlunparse(parsed._replace(path=f"/{name}"))


async def admin(sql: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL, timeout=10)
    try:
        await asyncio.wait_for(conn.execute(sql), 60)
    finally:
        await conn.close()


# bench_<lib>_<pid>_<n>, or bench_<lib>_<n> as named before the pid was in it.
_OURS = re.compile(rf"{PREFIX}(?:{'|'.join(LIBS)})_(?:([0-9]+)_)?[0-9]+")


def _gone(pid: str | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    return False


async def drop_leftovers() -> None:
    """Databases a killed earlier run could not drop: only ours, and only those whose run's
    process is gone. A run beside this one (a smoke test's, deep_queue.py's, scale.py's) is
    using its own: dropped WITH (FORCE), its workers lost their tables mid-run."""
    conn = await asyncpg.connect(ADMIN_URL, timeout=10)
    try:
        names = [
            r["datname"]
            for r in await conn.fetch("SELECT datname FROM pg_database")
            if (ours := _OURS.fullmatch(r["datname"])) and _gone(ours.group(1))
        ]
    finally:
        await conn.close()
    for name in names:
        await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def fresh_db(lib: str) -> AsyncIterator[str]:
    # This process's pid in the name: two runs side by side (the smoke tests run several at
    # once) each counted from 1, and each dropped and made again the other's database.
    name = f"{PREFIX}{lib}_{os.getpid()}_{next(_counter)}"
    await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin(f'CREATE DATABASE "{name}"')
    try:
        yield db_url(name)
    finally:
        # Shielded from our own cancellation: a Ctrl-C must still drop it.
        await asyncio.shield(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def analyze(url: str) -> float:
    """VACUUM ANALYZE the whole database (every library's tables alike); answers its seconds.
    Run after the enqueue, before any worker starts: the planner's statistics are in place,
    as autovacuum would have put them after a minute of traffic."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        started = time.perf_counter()
        await asyncio.wait_for(conn.execute("VACUUM ANALYZE"), 120)
        return time.perf_counter() - started
    finally:
        await conn.close()


async def query_row(url: str, sql: str) -> tuple[Any, ...]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        row = await asyncio.wait_for(conn.fetchrow(sql), 30)
    finally:
        await conn.close()
    return tuple(row) if row is not None else ()


# --- workloads ---------------------------------------------------------------------------

Result = dict[str, Any]


async def _process(
    lib: str,
    url: str,
    conc: int,
    workdir: Path,
    done: Callable[[], Awaitable[tuple[int, Any]]],
    *,
    warm: bool,
    jobs: int | None = None,
    kind: str = "noop",
    enqueue_args: tuple[str, ...] = (),
) -> Result:
    """Enqueue ``jobs`` (default ``Sizes.jobs``) in one batch, then (``warm``) VACUUM ANALYZE,
    then time one worker of ``kind`` processing them."""
    jobs = Sizes.jobs if jobs is None else jobs
    enq = await run_once(
        lib,
        ["enqueue", "--install", "--db", url, "--n", str(jobs), *enqueue_args],
        workdir,
        f"{lib}-enqueue",
        300,
    )
    analyzed = await analyze(url) if warm else None
    mark = workdir / f"{lib}-{time.monotonic_ns()}.marks"
    worker = await start_worker(lib, url, conc, kind, mark, workdir)
    async with running(worker):
        # The CPU the worker process and the local PostgreSQL spend on the batch, for the cost
        # a job (the queue was filled before the worker started; the orchestrator's own polls
        # open a connection each, whose backend is gone by the second read).
        spent = (process_cpu(worker.proc.pid), postgres_cpu())
        deadline = time.monotonic() + Sizes.throughput_bound
        window_ends = None
        while True:
            count, last = await done()
            if count >= jobs:
                break
            marks = read_marks(mark)
            if marks and window_ends is None:
                # The window starts at the first handler start (start-up excluded).
                window_ends = time.monotonic() + Sizes.window - (time.time() - _first(marks))
            if window_ends is not None and time.monotonic() > window_ends and count:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{lib}: {count}/{jobs} done in {Sizes.throughput_bound} s")
            if worker.proc.returncode is not None:
                raise BenchError(f"{lib} worker died ({worker.proc.returncode}){worker.tail()}")
            await asyncio.sleep(0.1)
        spent_after = (process_cpu(worker.proc.pid), postgres_cpu())
    marks = read_marks(mark)
    first = _first(marks)
    worker_us, server_us = (
        None if b is None or a is None else (a - b) / count * 1e6
        for b, a in zip(spent, spent_after, strict=True)
    )
    return {
        "enqueue_jps": jobs / enq["seconds"],
        "process_jps": count / (float(last) - first),
        "worker_cpu_us": worker_us,
        "server_cpu_us": server_us,
        "processed": count,
        "jobs": jobs,
        "analyze_s": analyzed,
        "failed_once": sum(1 for line in marks if line.startswith("fail ")),
    }


def _first(marks: list[str]) -> float:
    return next(float(line.split()[1]) for line in marks if line.startswith("first "))


def _done_of(url: str, lib: str) -> Callable[[], Awaitable[tuple[int, Any]]]:
    """The library's completed count and last completion time, read from its tables."""

    async def done() -> tuple[int, Any]:
        row = await query_row(url, DONE_SQL[lib])
        return int(row[0]), row[1]

    return done


async def _throughput(lib: str, conc: int, workdir: Path, *, warm: bool) -> Result:
    async with fresh_db(lib) as url:
        done = _done_of(url, lib)

        return await _process(lib, url, conc, workdir, done, warm=warm)


async def throughput(lib: str, conc: int, workdir: Path) -> Result:
    return await _throughput(lib, conc, workdir, warm=True)


async def cold(lib: str, conc: int, workdir: Path) -> Result:
    """The same batch on a fresh database with no planner statistics: a second, labelled
    workload (the peers' claim queries pick bad plans here; never the headline)."""
    return await _throughput(lib, conc, workdir, warm=False)


async def sqlite_throughput(lib: str, conc: int, workdir: Path) -> Result:
    assert lib in OURS
    path = workdir / f"sqlite-{next(_counter)}.db"
    url = f"sqlite:///{path}"

    async def done() -> tuple[int, Any]:
        def read() -> tuple[int, Any]:
            with contextlib.closing(sqlite3.connect(path, timeout=10)) as conn:
                count, last = conn.execute(DONE_SQLITE).fetchone()
                return int(count), last

        return await asyncio.to_thread(read)

    try:
        return await _process(lib, url, conc, workdir, done, warm=False)
    finally:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")


async def retries(lib: str, conc: int, workdir: Path) -> Result:
    """The throughput batch, every ``Sizes.fail_every``-th job failing its first attempt (each
    library retrying at once, by its own documented retry): jobs/s to all completed, and the
    attempts run (completions + planned failures, counted by the handler)."""
    async with fresh_db(lib) as url:
        done = _done_of(url, lib)

        fail = ("--fail-every", str(Sizes.fail_every))
        result = await _process(
            lib, url, conc, workdir, done, warm=True, kind="flaky", enqueue_args=fail
        )
        result["attempts"] = result["processed"] + result["failed_once"]
        result["attempts_per_job"] = result["attempts"] / max(result["processed"], 1)
        return result


async def steps(lib: str, conc: int, workdir: Path) -> Result:
    """jobs_trio alone (the peers have no durable steps): ``Sizes.steps_jobs`` jobs of 10
    no-op ``ctx.step.run`` each; jobs/s, steps/s and the wall time per step at this
    concurrency (1 / steps/s)."""
    assert lib == "jobs_trio"
    async with fresh_db(lib) as url:
        done = _done_of(url, lib)

        result = await _process(
            lib, url, conc, workdir, done, warm=True, kind="steps", jobs=Sizes.steps_jobs
        )
        result["steps_ps"] = result["process_jps"] * 10
        result["step_us"] = 1e6 / result["steps_ps"]
        return result


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, KiB, from /proc (Linux)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


async def memory(lib: str, conc: int, workdir: Path) -> Result:
    """``Sizes.rss_jobs`` queued, VACUUM ANALYZE, one worker at ``conc``: its RSS when ready
    (nothing claimed yet), the largest sampled while it works through the queue (over the
    whole batch, or ``Sizes.window`` s from the first start), and its peak (VmHWM)."""
    async with fresh_db(lib) as url:
        args = ["enqueue", "--install", "--db", url, "--n", str(Sizes.rss_jobs)]
        await run_once(lib, args, workdir, f"{lib}-enqueue", 300)
        await analyze(url)
        mark = workdir / f"{lib}-{time.monotonic_ns()}.marks"
        worker = await start_worker(lib, url, conc, "noop", mark, workdir)
        pid = worker.proc.pid
        async with running(worker):
            ready_kib, _ = rss_kib(pid)
            largest = ready_kib
            ends = time.monotonic() + Sizes.throughput_bound
            started = None
            count = 0
            while time.monotonic() < ends:
                largest = max(largest, rss_kib(pid)[0])
                if started is None and read_marks(mark):
                    started = time.monotonic()
                    ends = started + Sizes.window
                count = int((await query_row(url, DONE_SQL[lib]))[0])
                if count >= Sizes.rss_jobs:
                    break
                await asyncio.sleep(Sizes.rss_every)
            peak = rss_kib(pid)[1]
        return {
            "ready_mib": ready_kib / 1024,
            "working_mib": largest / 1024,
            "peak_mib": peak / 1024,
            "processed": count,
            "queued": Sizes.rss_jobs,
        }


async def under_load(lib: str, conc: int, workdir: Path) -> Result:
    """Probe jobs' latency while the worker runs a steady load: ``Sizes.load_rate`` jobs/s, or
    ``Sizes.load_share`` of what this library sustains when that is less (measured first, in
    the same run, by feeding it all it takes), so the queue stays short and the probe measures
    the wake-up and the claim under load, not a growing backlog."""
    async with fresh_db(lib) as url:
        await run_once(
            lib, ["enqueue", "--install", "--db", url, "--n", "0"], workdir, f"{lib}-schema", 120
        )
        await analyze(url)
        mark = workdir / f"{lib}-{time.monotonic_ns()}.marks"
        worker = await start_worker(lib, url, conc, "probe", mark, workdir)
        feed = await Proc.start(lib, ["load", "--db", url], workdir, f"{lib}-load", stdin=True)
        async with running(worker), running(feed, grace=5.0):
            # The feed's backlog check runs 50 times a second: by index, for every library
            # alike. As a sequential scan it read every finished row each time, a third of a
            # core by the run's end for a library that keeps them (jobs_trio, Procrastinate)
            # and nothing for one that moves them out (PgQueuer): the harness, not the worker.
            conn = await asyncpg.connect(url, timeout=10, server_settings={"enable_seqscan": "off"})
            fed: dict[str, float] = {"jobs": 0, "skipped": 0, "rate": Sizes.load_offer}
            stop = asyncio.Event()
            feeding = asyncio.create_task(_feed(feed, conn, lib, fed, stop))
            try:
                # Calibration: fed up to the rate (the cap holds the backlog), its rate read
                # over the last part, once the worker has ramped up.
                await asyncio.sleep(Sizes.load_ramp)
                sustained = await _rate(url, lib, Sizes.load_calibrate)
                fed["rate"] = min(Sizes.load_rate, Sizes.load_share * sustained)
                # The calibration's backlog (up to twice the cap) drains before the probes: a
                # library that sustains 50 jobs/s needs seconds for it, and its probes would
                # wait behind it past their bound.
                drained_by = time.monotonic() + Sizes.load_drain
                while time.monotonic() < drained_by:
                    if (await query_row(url, READY_SQL[lib]))[0] <= Sizes.load_cap // 2:
                        break
                    await asyncio.sleep(0.1)
                # Settle: the calibration's backlog drains; while the queue still reaches the
                # cap (the probe client and the feed take CPU the calibration did not have on
                # a small machine), feed less, by load_share again, a few times at most.
                for _ in range(Sizes.load_settle_tries):
                    skipped = fed["skipped"]
                    await asyncio.sleep(Sizes.load_settle)
                    if fed["skipped"] == skipped:
                        break
                    fed["rate"] *= Sizes.load_share
                before, fed_before, t0 = await _done_count(url, lib), fed["jobs"], time.monotonic()
                skipped_before = fed["skipped"]
                n, gap = Sizes.probe_jobs, Sizes.probe_gap
                args = ["latency", "--db", url, "--n", str(n), "--gap", str(gap)]
                answer = await run_once(lib, args, workdir, f"{lib}-probe", 120)
                await wait_for(lambda: len(read_marks(mark)) >= n, 10)
                after, fed_after, t1 = await _done_count(url, lib), fed["jobs"], time.monotonic()
                # Read on a connection of its own: the feed task reads the backlog on `conn`
                # at any moment, and asyncpg refuses a second operation in flight on one.
                waiting = (await query_row(url, READY_SQL[lib]))[0]
            finally:
                stop.set()
                await feeding
                await conn.close()
        started = {int(i): float(t) for i, t in (line.split() for line in read_marks(mark))}
        missing = [i for i in range(n) if i not in started]
        if missing:
            raise BenchError(f"{lib}: {len(missing)} of {n} probe jobs never started")
        called, returned = answer["called"], answer["returned"]
        from_call = sorted((started[i] - called[i]) * 1000 for i in range(n))
        call = sorted((returned[i] - called[i]) * 1000 for i in range(n))
        return {
            "sustained_jps": sustained,  # calibration: fed all it takes
            "target_jps": fed["rate"],
            "load_jps": (after - before) / (t1 - t0),  # processed while probed, probes included
            "fed_jps": (fed_after - fed_before) / (t1 - t0),
            "skipped_ticks": fed["skipped"] - skipped_before,  # while probed: over the cap
            "waiting_after": waiting,
            "probe_p50_ms": _quantile(from_call, 0.50),
            "probe_p99_ms": _quantile(from_call, 0.99),
            "probe_call_p50_ms": _quantile(call, 0.50),
        }


async def _done_count(url: str, lib: str) -> int:
    return int((await _done_of(url, lib)())[0])


async def _rate(url: str, lib: str, seconds: float) -> float:
    """Jobs completed per second over the next ``seconds``."""
    before, t0 = await _done_count(url, lib), time.monotonic()
    await asyncio.sleep(seconds)
    return (await _done_count(url, lib) - before) / (time.monotonic() - t0)


async def _feed(
    feed: Proc, conn: asyncpg.Connection, lib: str, fed: dict[str, float], stop: asyncio.Event
) -> None:
    """Every ``Sizes.load_tick`` s, order what ``fed["rate"]`` owes (fractions carried over),
    up to twice ``Sizes.load_cap`` waiting, unless more than ``Sizes.load_cap`` jobs wait;
    what a skipped tick owed, or the bound cut, is dropped, and a
    late tick is not made up for: the rate is what the feed reached, said beside it."""
    assert feed.proc.stdin is not None
    tick = Sizes.load_tick
    due, owed = time.monotonic(), 0.0
    try:
        while not stop.is_set():
            due = max(due + tick, time.monotonic())
            owed += fed["rate"] * tick
            batch = int(owed)
            waiting = await conn.fetchval(READY_SQL[lib]) if batch else 0
            if batch and waiting > Sizes.load_cap:
                fed["skipped"] += 1
                owed = 0.0
            elif batch:
                # Never past twice the cap waiting, as when the offer was the cap a tick: a
                # deeper backlog slows some libraries' claims (PgQueuer's sustained fell from
                # ~7,300 to ~6,000 jobs/s offered 600 a tick). What the bound cuts is dropped.
                batch = min(batch, 2 * Sizes.load_cap - waiting)
                owed -= int(owed)
                feed.proc.stdin.write(f"{batch}\n".encode())
                await feed.proc.stdin.drain()
                if await feed.line(30) != "ok":
                    raise BenchError(f"{lib} load feed did not say ok{feed.tail()}")
                fed["jobs"] += batch
            await asyncio.sleep(max(0.0, due - time.monotonic()))
    finally:
        feed.proc.stdin.close()


async def latency(lib: str, conc: int, workdir: Path) -> Result:
    async with fresh_db(lib) as url:
        await run_once(
            lib, ["enqueue", "--install", "--db", url, "--n", "0"], workdir, f"{lib}-schema", 120
        )
        await analyze(url)  # as throughput does, for all alike
        mark = workdir / f"{lib}-{time.monotonic_ns()}.marks"
        worker = await start_worker(lib, url, conc, "latency", mark, workdir)
        async with running(worker):
            await asyncio.sleep(0.5)  # idle
            n, gap = Sizes.latency_jobs, Sizes.latency_gap
            args = ["latency", "--db", url, "--n", str(n), "--gap", str(gap)]
            answer = await run_once(lib, args, workdir, f"{lib}-latency", 120)
            await wait_for(lambda: len(read_marks(mark)) >= n, 10)
        started = {int(i): float(t) for i, t in (line.split() for line in read_marks(mark))}
        called, returned = answer["called"], answer["returned"]
        missing = [i for i in range(n) if i not in started]
        if missing:
            raise BenchError(f"{lib}: {len(missing)} of {n} latency jobs never started")
        result: Result = {"loop": answer.get("loop")}
        for key, since, until in (
            ("call", called, returned),  # the enqueue call alone
            ("", returned, started),  # the call's return → the handler's start
            ("from_call", called, started),  # the call's start → the handler's start
        ):
            ms = sorted((until[i] - since[i]) * 1000 for i in range(n))
            prefix = f"{key}_" if key else ""
            result[f"{prefix}p50_ms"] = _quantile(ms, 0.50)
            result[f"{prefix}p99_ms"] = _quantile(ms, 0.99)
        return result


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _starts(mark: Path) -> list[float]:
    return [float(line.split()[1]) for line in read_marks(mark) if line.startswith("start")]


async def _one_sleeping_job(lib: str, url: str, workdir: Path) -> tuple[Proc, Path, float]:
    """Worker 1 up, the sleeping job enqueued and started; answers when it started."""
    await run_once(
        lib, ["enqueue", "--install", "--db", url, "--n", "0"], workdir, f"{lib}-schema", 120
    )
    mark = workdir / f"{lib}-{time.monotonic_ns()}-1.marks"
    worker = await start_worker(lib, url, 10, "sleep", mark, workdir)
    try:
        args = ["enqueue", "--db", url, "--n", "1", "--sleep", str(Sizes.sleep)]
        await run_once(lib, args, workdir, f"{lib}-enqueue", 60)
        starts = await wait_for(lambda: _starts(mark), 30)
        if not starts:
            raise BenchError(f"{lib}: the sleeping job never started{worker.tail()}")
    except BaseException:
        await worker.stop(1.0)
        raise
    return worker, mark, starts[0]


async def _signal_when_due(worker: Proc, started: float, signum: int) -> float:
    """Send ``signum`` ``Sizes.signal_after`` seconds after the job started; answer when."""
    await asyncio.sleep(max(0.0, started + Sizes.signal_after - time.monotonic()))
    sent = time.monotonic()
    worker.signal(signum)
    return sent


async def drain(lib: str, conc: int, workdir: Path) -> Result:
    async with fresh_db(lib) as url:
        worker, _, started = await _one_sleeping_job(lib, url, workdir)
        async with running(worker, grace=0.0):
            sent = await _signal_when_due(worker, started, signal.SIGTERM)
            exited = await worker.wait(Sizes.drain_exit_bound)
            exit_s = time.monotonic() - sent if exited else None
        state, attempts = (await query_row(url, JOB_SQL[lib]) + (None, None))[:2]
        rerun_s: float | None = None
        if state not in FINISHED:
            mark2 = workdir / f"{lib}-{time.monotonic_ns()}-2.marks"
            second = await start_worker(lib, url, 10, "sleep", mark2, workdir)
            async with running(second, grace=0.0):
                up = time.monotonic()
                starts = await wait_for(lambda: _starts(mark2), Sizes.rerun_bound)
                rerun_s = starts[0] - up if starts else None
                second.signal(signal.SIGKILL)
        return {
            "exit_s": exit_s,
            "state": str(state),
            "attempts": attempts,
            "rerun_s": rerun_s,
            "finished": state in FINISHED,
        }


async def rescue(lib: str, conc: int, workdir: Path) -> Result:
    async with fresh_db(lib) as url:
        worker, _, started = await _one_sleeping_job(lib, url, workdir)
        async with running(worker, grace=0.0):
            killed = await _signal_when_due(worker, started, signal.SIGKILL)
            await worker.wait(10)
        mark2 = workdir / f"{lib}-{time.monotonic_ns()}-2.marks"
        second = await start_worker(lib, url, 10, "sleep", mark2, workdir)
        async with running(second, grace=0.0):
            budget = Sizes.rescue_bound - (time.monotonic() - killed)
            starts = await wait_for(lambda: _starts(mark2), budget, every=0.02)
            second.signal(signal.SIGKILL)
        return {"rescue_s": starts[0] - killed if starts else None}


WORKLOADS: dict[str, Callable[[str, int, Path], Awaitable[Result]]] = {
    "throughput": throughput,
    "cold": cold,
    "latency": latency,
    "drain": drain,
    "rescue": rescue,
    "sqlite": sqlite_throughput,
    "load": under_load,
    "retries": retries,
    "steps": steps,
    "memory": memory,
}
# Workloads the peers cannot run: jobs_trio alone.
ALONE = ("sqlite", "steps")
# Run once in `all` (bounded waits and states, or a size, not rates: one repetition fits).
ONCE = ("drain", "rescue", "memory")
# What `all` runs, in this order (also the table's), sqlite last. The deep queue is not here:
# its 1,000,000-deep cells alone take ~5 minutes; `python bench/deep_queue.py` runs it.
ALL = ("throughput", "latency", "load", "retries", "steps", "memory", "cold", "drain", "rescue")


def cells(workload: str, concurrencies: list[int]) -> list[tuple[str, int]]:
    if workload == "throughput":
        return [("throughput", c) for c in concurrencies]
    if workload == "sqlite":
        return [("sqlite", 10)]
    if workload == "cold":
        return [("cold", Sizes.cold_concurrency)]
    if workload == "load":
        return [("load", Sizes.load_concurrency)]
    if workload == "retries":
        return [("retries", Sizes.retry_concurrency)]
    if workload == "steps":
        return [("steps", Sizes.steps_concurrency)]
    if workload == "memory":
        return [("memory", Sizes.rss_concurrency)]
    return [(workload, 10)]


# --- reporting ---------------------------------------------------------------------------

# (cell label, metric, unit, higher is better)
METRICS = {
    "throughput": [
        ("process_jps", "jobs/s processed", True),
        ("enqueue_jps", "jobs/s enqueued (one batch)", True),
        ("worker_cpu_us", "worker process CPU µs a job", False),
        ("server_cpu_us", "PostgreSQL CPU µs a job", False),
    ],
    "cold": [("process_jps", "jobs/s processed", True)],
    "sqlite": [
        ("process_jps", "jobs/s processed", True),
        ("enqueue_jps", "jobs/s enqueued (one batch)", True),
    ],
    "latency": [
        ("call_p50_ms", "one enqueue call p50, ms", False),
        ("call_p99_ms", "one enqueue call p99, ms", False),
        ("p50_ms", "call's return→start p50, ms", False),
        ("p99_ms", "call's return→start p99, ms", False),
        ("from_call_p50_ms", "call's start→start p50, ms", False),
        ("from_call_p99_ms", "call's start→start p99, ms", False),
    ],
    "drain": [
        ("exit_s", "SIGTERM→exit, s", False),
        ("rerun_s", "2nd worker ready→job runs, s", False),
    ],
    "rescue": [("rescue_s", "SIGKILL→job runs on 2nd worker, s", False)],
    "load": [
        ("sustained_jps", "sustained when fed all it takes, jobs/s", True),
        ("target_jps", "load fed while probed (see How), jobs/s", True),
        ("load_jps", "load reached while probed, jobs/s processed", True),
        ("probe_p50_ms", "probe call's start→start p50, ms", False),
        ("probe_p99_ms", "probe call's start→start p99, ms", False),
        ("probe_call_p50_ms", "probe enqueue call p50, ms", False),
        ("waiting_after", "jobs waiting at the probes' end (cap 200: at it, saturated)", False),
    ],
    "retries": [
        ("process_jps", "jobs/s to completed (10% retried once)", True),
        ("attempts", "attempts run (handler starts)", False),
    ],
    "steps": [
        ("process_jps", "jobs/s (10 durable steps each)", True),
        ("steps_ps", "steps/s", True),
        ("step_us", "wall µs per step at this concurrency", False),
    ],
    "memory": [
        ("ready_mib", "worker RSS when ready, MiB", False),
        ("working_mib", "worker RSS working, largest sample, MiB", False),
        ("peak_mib", "worker peak RSS (VmHWM), MiB", False),
    ],
}
BOUNDS = {
    "exit_s": Sizes.drain_exit_bound,
    "rerun_s": Sizes.rerun_bound,
    "rescue_s": Sizes.rescue_bound,
}


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def summarise(values: list[Any], key: str) -> tuple[float | None, str]:
    """(median, 'median (min–max)') over the repetitions; a bound that was hit reads '>B'."""
    numbers = [v for v in values if isinstance(v, int | float)]
    hit = len(values) - len(numbers)
    if not values:
        return None, "—"
    if not numbers:
        return None, f">{_fmt(BOUNDS[key])}" if key in BOUNDS else "failed"
    med = statistics.median(numbers)
    text = (
        _fmt(med)
        if len(numbers) == 1
        else f"{_fmt(med)} ({_fmt(min(numbers))}–{_fmt(max(numbers))})"
    )
    if hit:
        text += f", {hit}× >{_fmt(BOUNDS[key])}" if key in BOUNDS else f", {hit} failed"
    return med, text


def _libs_of(workload: str, libs: list[str]) -> list[str]:
    if workload in ALONE:
        return [
            lib
            for lib in libs
            if lib in OURS and (lib == "jobs_trio" or workload in VARIANT_WORKLOADS)
        ]
    if workload in VARIANT_WORKLOADS:
        return libs
    return [lib for lib in libs if lib not in VARIANTS]


def table(results: dict[tuple[str, int, str], list[Result]], libs: list[str]) -> str:
    peers = [lib for lib in libs if lib not in OURS]
    ours = [lib for lib in libs if lib in OURS]
    head = ["workload", "metric", *libs]
    head += [f"{o} / {p}" for o in ours for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for workload, conc in sorted({(w, c) for w, c, _ in results}, key=_cell_order):
        label = f"throughput c={conc}" if workload == "throughput" else workload
        if workload == "sqlite":
            label = f"SQLite c={conc}"
        if workload == "cold":
            label = f"cold planner c={conc}"
        if workload in ("load", "retries", "steps", "memory"):
            label = {
                "load": "latency under load",
                "retries": "retries",
                "steps": "durable steps",
                "memory": f"memory, {Sizes.rss_jobs:,} queued",
            }[workload] + f" c={conc}"
        for key, metric, _ in METRICS[workload]:
            meds: dict[str, float | None] = {}
            row = [label, metric]
            for lib in libs:
                runs = results.get((workload, conc, lib), [])
                ok = [r for r in runs if "error" not in r]
                if key == "rerun_s" and ok and all(r.get("finished") for r in ok):
                    # Its job finished during the first worker's shutdown: nothing to run again.
                    meds[lib], text = None, "n/a (job completed during the drain)"
                else:
                    meds[lib], text = summarise([r.get(key) for r in ok], key)
                if key == "process_jps" and any(
                    r.get("processed", 0) < r.get("jobs", Sizes.jobs) for r in runs
                ):
                    text += " ‡"
                errors = sum(1 for r in runs if "error" in r)
                row.append(text + (f" ({errors} failed)" if errors else "") if runs else "—")
            for o in ours:
                for peer in peers:
                    row.append(_ratio(meds.get(o), meds.get(peer)))
            lines.append("| " + " | ".join(row) + " |")
    if any(
        r.get("processed", 0) < r["jobs"] for runs in results.values() for r in runs if "jobs" in r
    ):
        lines.append("")
        lines.append(
            f"‡ did not finish its batch ({Sizes.jobs:,} jobs; durable steps {Sizes.steps_jobs:,})"
            f" within the {Sizes.window:.0f} s window: the rate is over the jobs completed in the"
            " window, on the same deep queue."
        )
    lines.append("")
    lines.append("Load average (1 min, `os.getloadavg`) at the start of each run, min–max:")
    lines.append("")
    for lib in libs:
        loads = [
            r["load1"] for k, runs in results.items() if k[2] == lib for r in runs if "load1" in r
        ]
        if loads:
            lines.append(f"- {lib}: {min(loads):.2f}–{max(loads):.2f} over {len(loads)} runs")
    gauges = [r["gauge_ms"] for runs in results.values() for r in runs if "gauge_ms" in r]
    if gauges:
        lines.append("")
        lines.append(
            f"Speed gauge (`speed_gauge`: ms for {GAUGE_ADDITIONS:,} additions in a Python loop,"
            f" best of 3, before each run): {min(gauges):.0f}–{max(gauges):.0f} ms. This VM's"
            " speed changes over a day by several times (steal time): compare figures only"
            " within one run, never with another run's."
        )
    drains = {k: v for k, v in results.items() if k[0] == "drain"}
    if drains:
        lines.append("")
        lines.append("Drain, the job after the first worker exited (each repetition):")
        lines.append("")
        for (_, _, lib), runs in sorted(drains.items(), key=lambda kv: libs.index(kv[0][2])):
            seen = ", ".join(
                f"{r.get('state')} / attempts {r.get('attempts')}" if "error" not in r else "failed"
                for r in runs
            )
            lines.append(f"- {lib}: {seen}")
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "—"
    r = a / b
    return f"{r:.2f}×" if r >= 0.1 else f"{r:.4f}×"


def _cell_order(cell: tuple[str, int]) -> tuple[int, int]:
    order = [*ALL, "sqlite"]
    return order.index(cell[0]), cell[1]


GAUGE_ADDITIONS = 1_000_000


def speed_gauge() -> float:
    """Milliseconds for a fixed pure-Python loop, best of 3: how fast this machine runs Python
    right now, beside each run's figures (the host lends it more or less CPU over a day)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for i in range(GAUGE_ADDITIONS):
            total += i
        best = min(best, time.perf_counter() - started)
    return best * 1000


def machine() -> str:
    mem = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = []
    for dist in (
        "jobs-trio",
        "pgqueuer",
        "procrastinate",
        "trio",
        "trio-asyncio",
        "asyncpg",
        "psycopg",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
    pg = "?"
    with contextlib.suppress(Exception):
        pg = asyncio.run(_pg_version())
    return "\n".join(
        [
            f"- CPU: {os.cpu_count()} cores (nproc), {cpu}",
            f"- memory: {mem}",
            f"- PostgreSQL: {pg} on {urlparse(ADMIN_URL).hostname} (same machine)",
            f"- Python: {platform.python_version()} ({platform.platform()})",
            f"- libraries: {', '.join(versions)}",
        ]
    )


async def _pg_version() -> str:
    row = await query_row(ADMIN_URL, "SHOW server_version")
    return str(row[0])


# --- main --------------------------------------------------------------------------------


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jobs-trio-bench-") as path:
        yield Path(path)


async def run(args: argparse.Namespace) -> dict[tuple[str, int, str], list[Result]]:
    await drop_leftovers()
    workloads = [*ALL, "sqlite"] if args.workload == "all" else [args.workload]
    plan = [cell for w in workloads for cell in cells(w, args.concurrency)]
    results: dict[tuple[str, int, str], list[Result]] = defaultdict(list)
    began = time.monotonic()
    with _workdir() as workdir:
        for rep in range(1, args.reps + 1):
            for workload, conc in plan:
                if workload in ONCE and rep > Sizes.event_reps:
                    continue
                libs = _libs_of(workload, args.lib)
                for lib in libs:  # A B C, A B C, ...: drift in the machine hits all alike
                    t0 = time.monotonic()
                    load1 = os.getloadavg()[0]  # the machine is shared: every figure beside it
                    gauge = speed_gauge()
                    try:
                        result = await WORKLOADS[workload](lib, conc, workdir)
                    except BenchError as exc:
                        result = {"error": str(exc)}
                    result["load1"] = load1
                    result["gauge_ms"] = gauge
                    results[(workload, conc, lib)].append(result)
                    shown = ", ".join(
                        f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in result.items()
                    )
                    print(
                        f"[{time.monotonic() - began:6.0f}s] rep {rep} {workload:<10} c={conc:<3}"
                        f" {lib:<14} {shown}  ({time.monotonic() - t0:.1f}s)",
                        flush=True,
                    )
    return results


RESULTS_BEGIN = "<!-- figures:begin (written by bench/run.py all) -->"
RESULTS_END = "<!-- figures:end -->"


def write_results(path: Path, command: str, figures: str, minutes: float) -> None:
    block = "\n".join(
        [
            RESULTS_BEGIN,
            f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {minutes:.1f} min,"
            f" command: `{command}`",
            "",
            machine(),
            "",
            figures,
            RESULTS_END,
        ]
    )
    old = path.read_text() if path.exists() else ""
    if RESULTS_BEGIN in old and RESULTS_END in old:
        before, rest = old.split(RESULTS_BEGIN, 1)
        after = rest.split(RESULTS_END, 1)[1]
        text = before + block + after
    else:
        text = "# Benchmark results\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workload", choices=[*WORKLOADS, "all"])
    parser.add_argument("--lib", action="append", choices=LIBS, help="repeatable (default: all)")
    parser.add_argument(
        "--concurrency", action="append", type=int, help="throughput (default 1 10 50)"
    )
    parser.add_argument(
        "--reps", type=int, help="repetitions (default 2 for all, else 1; drain and rescue: 1)"
    )
    parser.add_argument("--jobs", type=int, default=Sizes.jobs, help="throughput batch size")
    parser.add_argument(
        "--rss-jobs", type=int, default=Sizes.rss_jobs, help="memory: jobs queued (issue: 200000)"
    )
    parser.add_argument("--results", type=Path, help="write the table here (all: bench/RESULTS.md)")
    args = parser.parse_args(argv)
    args.lib = args.lib or list(LIBS)
    args.concurrency = args.concurrency or [1, 10, 50]
    args.reps = args.reps or (2 if args.workload == "all" else 1)
    Sizes.jobs = args.jobs
    Sizes.rss_jobs = args.rss_jobs
    if args.workload == "all" and args.results is None:
        args.results = HERE / "RESULTS.md"
    command = "python bench/run.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    began = time.monotonic()
    results = asyncio.run(run(args))
    figures = table(results, args.lib)
    print()
    print(figures)
    errors = [(k, r["error"]) for k, runs in results.items() for r in runs if "error" in r]
    for (workload, conc, lib), error in errors:
        print(f"\n{workload} c={conc} {lib} failed: {error}", file=sys.stderr)
    if args.results:
        write_results(args.results, command, figures, (time.monotonic() - began) / 60)
        raw = args.results.with_suffix(".json")
        raw.write_text(
            json.dumps(
                [
                    {"workload": w, "concurrency": c, "lib": lib, "runs": runs}
                    for (w, c, lib), runs in results.items()
                ],
                indent=1,
            )
        )
        print(f"\nwritten to {args.results} (every run's figures: {raw})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
