# `jobs-trio demo`: a few seconds' tour on a fresh file: jobs that succeed, a retry, a dead
# letter, and a drain that interrupts a long job without costing it an attempt.
# Apart from cli.py because it declares jobs of its own and drives two workers in one process.
from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TextIO

import trio

from .._core import render as render
from .._core.backoff import Backoff
from .._core.errors import ConfigError, JobsError
from .._core.logs import logger
from .._core.records import JobId, JobRecord, JobState
from .._core.redaction import redact_url
from .._jobs.registry import Registry
from .._run.context import JobContext
from .._run.lifecycle import open_lifecycle
from .._run.worker import open_worker
from ..drivers._open_driver import DriverKind, driver_kind, open_driver
from ..drivers._sqlite_migrate import FileKind, identify, sqlite_path
from ..drivers.contract import Driver

GRACE = 5.0  # worker 1's drain budget; the long job hears the drain at once and needs none
LONG_FIRST_RUN = 60.0  # what the long job would take if nothing interrupted it
LONG_RESUME = 0.3  # what is left of it once it finds its checkpoint
PATIENCE = 30.0  # how long any phase may take before the demo says it is stuck
POLL = 0.05
WORKER_OPTIONS: Mapping[str, Any] = {
    "concurrency": 4,
    "poll_interval": 0.1,
    "stats_interval": None,
}
GREETED = ("ada", "grace", "linus", "barbara", "ken")


# The jobs. Every failure here is simulated, and the output says so.


async def greet(ctx: JobContext, payload: dict[str, Any]) -> dict[str, str]:
    await trio.sleep(payload["seconds"])
    return {"greeted": payload["who"]}


async def flaky(ctx: JobContext, payload: object) -> dict[str, int]:
    await trio.sleep(0.05)
    if ctx.attempt == 1:
        raise ConnectionError("simulated outage on attempt 1")
    return {"succeeded_on_attempt": ctx.attempt}


async def doomed(ctx: JobContext, payload: object) -> None:
    await trio.sleep(0.02)
    raise ValueError(f"simulated bug, attempt {ctx.attempt} of {ctx.max_attempts}")


async def _who(worker_id: str) -> str:
    return worker_id


async def long_job(ctx: JobContext, payload: dict[str, float]) -> dict[str, object]:
    # The checkpoint is a durable step: recorded by the first run, replayed (not re-run) by
    # any later one. A run that finds it recorded by another worker resumes after it.
    started_by = await ctx.step.run("started", _who, ctx.worker_id)
    if started_by == ctx.worker_id:
        await trio.sleep(payload["first_run"])
        return {"finished_by": ctx.worker_id, "resumed": False}
    await trio.sleep(payload["resume"])
    return {"started_by": started_by, "finished_by": ctx.worker_id, "resumed": True}


def demo_registry() -> Registry:
    registry = Registry()
    registry.job("demo.greet", queue="demo")(greet)
    registry.job("demo.flaky", queue="demo", attempts=3, backoff=Backoff(base=0.3, jitter=0))(flaky)
    registry.job("demo.doomed", queue="demo", attempts=3, backoff=Backoff(base=0.1, jitter=0))(
        doomed
    )
    registry.job("demo.long", queue="slow", attempts=3, timeout=2 * LONG_FIRST_RUN)(long_job)
    return registry


# Saying what happens.


class Narrator:
    """Progress lines, stamped with the seconds since the demo started."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.started = trio.current_time()

        self.silent = False

    def __call__(self, text: str) -> None:
        if self.silent:
            return
        try:
            print(f"[{trio.current_time() - self.started:5.2f}s] {text}", file=self.out, flush=True)
        except OSError:
            # The reader went away (`jobs-trio demo | head`): called from the workers' log
            # events, an error here would crash a worker mid-run; the demo just stops talking.
            self.silent = True


class _Events(logging.Handler):
    """Turns the workers' log events (stable names: docs/logging.md) into progress."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.DEBUG)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        event: str = getattr(record, "event", "")
        f: dict[str, Any] = getattr(record, "fields", {})
        error = render.short(str(f.get("error")), 60)
        lines = {
            "jobs.worker.started": f"{f.get('worker')} started, claiming from {f.get('queues')}",
            "jobs.attempt.completed": f"{f.get('job')} completed on attempt {f.get('attempt')}",
            "jobs.attempt.retried": f"{f.get('job')} failed attempt {f.get('attempt')}"
            f" ({error}); retry after its backoff",
            "jobs.attempt.dead-lettered": f"{f.get('job')} failed attempt {f.get('attempt')}"
            f" ({error}); no attempts left: dead",
            "jobs.worker.drain-signalled": f"{f.get('worker')} draining: claims stopped,"
            f" {f.get('runs')} running job(s) cancelled with reason 'draining'",
            "jobs.attempt.interrupted": f"{f.get('job')} interrupted on attempt"
            f" {f.get('attempt')}: back to ready, the attempt handed back",
            "jobs.worker.stopped": f"{f.get('worker')} stopped",
        }
        if event in lines:
            self.say(lines[event])


@contextlib.contextmanager
def _narrating(say: Callable[[str], None], verbose: bool) -> Iterator[None]:
    handlers: list[logging.Handler] = [_Events(say)]
    if verbose:
        raw = logging.StreamHandler(sys.stderr)
        raw.setLevel(logging.INFO)
        raw.setFormatter(logging.Formatter("    %(levelname)s %(message)s"))
        handlers.append(raw)
    saved = logger.level, logger.propagate
    # Not propagated: without this, logging's last-resort handler would print every warning
    # (the simulated failures' tracebacks) over the progress lines.
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    for handler in handlers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


# The file. The demo deletes its database before each run, and `--db` may point anywhere:
# it deletes only a file carrying the marker it writes into each file it creates (the table
# MARKER, naming the file's device and inode), never judging by the names of the jobs inside.

MARKER = "jobs_trio_demo_marker"


def _start_fresh(url: str, say: Callable[[str], None]) -> None:
    """Delete the previous demo file, and only one this demo made; then make a new one."""
    kind = driver_kind(url)
    if kind is DriverKind.MEMORY:
        return
    if kind is not DriverKind.SQLITE:
        raise ConfigError(
            f"the demo runs on SQLite or memory://, not on {redact_url(url)!r}",
            fix="run it as `jobs-trio demo` (./jobs-demo.db) or --db memory://",
        )
    path = sqlite_path(url)
    if os.path.exists(path):
        _refuse_unless_made_here(path)
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path + suffix)
        say(f"removed the previous demo database {path} (each run starts fresh)")
    _create(path)


def _create(path: str) -> None:
    """Create the file, or refuse: O_EXCL makes "this run created it" a fact, not a guess,
    also when another process put a file there since the look above. Owner-only, as the
    SQLite driver creates its files."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise _not_ours(path, "it appeared while the demo started") from None
    except OSError as exc:
        raise ConfigError(
            f"the demo cannot create {path!r}: {exc}",
            fix="pass --db sqlite:///a/writable/folder/jobs-demo.db",
        ) from exc


def _mark(path: str) -> None:
    """Write the marker into the file `_create` made, once the driver has made it a jobs_trio
    database (it refuses a file holding tables it does not know) and before any job exists."""
    where = os.stat(path)
    with contextlib.closing(sqlite3.connect(path, timeout=PATIENCE)) as conn, conn:
        conn.execute(f"CREATE TABLE {MARKER} (device INTEGER, inode INTEGER, created_at REAL)")
        conn.execute(
            f"INSERT INTO {MARKER} VALUES (?, ?, ?)", (where.st_dev, where.st_ino, time.time())
        )


def _refuse_unless_made_here(path: str) -> None:
    where = os.stat(path)
    identity = identify(path)
    why = None
    if identity.kind is FileKind.NOT_SQLITE:
        why = f"it cannot be read as SQLite ({identity.problem})"
    elif identity.kind is not FileKind.JOBS_TRIO:
        why = "it is not a jobs_trio database"
    elif MARKER not in identity.tables:
        why = "the demo did not create it (it carries no demo marker)"
    else:
        try:
            uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
                why = _not_the_demos(conn, where)
        except sqlite3.Error as exc:
            why = f"it cannot be read as SQLite ({exc})"
    if why is not None:
        raise _not_ours(path, why)


def _not_the_demos(conn: sqlite3.Connection, where: os.stat_result) -> str | None:
    """Why a jobs_trio file carrying the demo's marker is still not the demo's to delete."""
    if not conn.execute(
        f"SELECT 1 FROM {MARKER} WHERE device = ? AND inode = ?", (where.st_dev, where.st_ino)
    ).fetchone():
        return "it is a copy of a demo database, not the file the demo created"
    # Exact names (`=` compares bytes): anything enqueued into the file since, by anyone, is
    # kept rather than deleted with the demo's own jobs.
    names = sorted(EXPECTED)
    (others,) = conn.execute(
        f"SELECT count(*) FROM jobs WHERE name NOT IN ({', '.join('?' * len(names))})", names
    ).fetchone()
    return f"it holds {others} job(s) that are not the demo's" if others else None


def _not_ours(path: str, why: str) -> ConfigError:
    return ConfigError(
        f"{path!r} exists and {why}; the demo deletes its database before each run, so it"
        " left this one untouched",
        fix="pass --db sqlite:///another-demo.db, or move that file away",
    )


# The run.


async def run_demo(url: str = "sqlite:///jobs-demo.db", verbose: bool = False) -> int:
    out = sys.stdout
    say = Narrator(out)
    _start_fresh(url, say)
    registry = demo_registry()
    with _narrating(say, verbose):
        async with open_driver(url) as driver:
            if driver_kind(url) is DriverKind.SQLITE:
                await trio.to_thread.run_sync(_mark, sqlite_path(url))
            ids = await _enqueue_batch(driver, registry, say)
            await _first_worker(driver, registry, ids, say)
            await _second_worker(driver, registry, ids, say)
            records = [await _get(driver, job_id) for job_id in ids]
    print(file=out)
    print(render.table(["JOB", "STATE", "ATTEMPTS", "LAST ERROR"], _rows(records)), file=out)
    print(file=out)
    surprises = _surprises(records)
    for line in surprises or _story(records):
        print(line, file=out)
    if driver_kind(url) is not DriverKind.MEMORY:  # a memory store is gone once the demo returns
        print(
            f"\nLook closer: jobs-trio show {ids[-1]} --db {url}\n"
            f"             jobs-trio list --db {url}   |   jobs-trio stats --db {url}",
            file=out,
        )
    return 1 if surprises else 0


async def _enqueue_batch(
    driver: Driver, registry: Registry, say: Callable[[str], None]
) -> list[JobId]:
    greetings = [{"who": who, "seconds": 0.05 * (n + 1)} for n, who in enumerate(GREETED)]
    ids = await registry.require("demo.greet").enqueue_many(driver, greetings)
    ids.append(await registry.require("demo.flaky").enqueue(driver))
    ids.append(await registry.require("demo.doomed").enqueue(driver))
    ids.append(
        await registry.require("demo.long").enqueue(
            driver, {"first_run": LONG_FIRST_RUN, "resume": LONG_RESUME}
        )
    )
    say(f"enqueued {len(ids)} jobs on {driver.url}:")
    say(f"  {len(greetings)} x demo.greet   succeed")
    say("  1 x demo.flaky   fails attempt 1 (simulated), then succeeds after a 0.3 s backoff")
    say("  1 x demo.doomed  always fails (simulated): 3 attempts, then dead")
    say(f"  1 x demo.long    awaits {LONG_FIRST_RUN:.0f} s on its first run")
    return ids


async def _first_worker(
    driver: Driver, registry: Registry, ids: list[JobId], say: Callable[[str], None]
) -> None:
    long_id = ids[-1]

    def quick_settled_and_long_running(records: dict[JobId, JobRecord]) -> bool:
        quick = [records[job_id] for job_id in ids[:-1]]
        settled = all(r.state in (JobState.COMPLETED, JobState.DEAD) for r in quick)
        return settled and records[long_id].state is JobState.RUNNING

    async with (
        open_lifecycle(grace=GRACE, signals=()) as lifecycle,
        open_worker(driver, registry, lifecycle=lifecycle, worker_id="worker-1", **WORKER_OPTIONS),
    ):
        records = await _until(driver, ids, quick_settled_and_long_running, "quick jobs settle")
        # Its checkpoint too: the second run is to find it.
        await _until_step(driver, long_id)
        say(f"quick jobs settled ({_counts(records)}); demo.long is running")
        # What the lifecycle runs on a real SIGTERM, called directly: no signal is sent, so
        # the demo cannot end a process it shares with a test runner.
        say(f"shutting worker-1 down as SIGTERM would: lifecycle.shutdown(), grace {GRACE:.0f} s")
        await lifecycle.shutdown("demo (as on SIGTERM)")
    record = await _get(driver, long_id)
    say(
        f"demo.long is {record.state} again with attempts {render.attempts(record)}"
        f" (the drained attempt is not counted); recorded: {render.short(record.last_error, 70)}"
    )


async def _second_worker(
    driver: Driver, registry: Registry, ids: list[JobId], say: Callable[[str], None]
) -> None:
    long_id = ids[-1]
    say(
        "starting worker-2: demo.long replays its recorded step 'started' (by worker-1) and, as"
        f" this demo's stand-in for resuming from a checkpoint, finishes in {LONG_RESUME} s"
    )

    def long_done(records: dict[JobId, JobRecord]) -> bool:
        return records[long_id].state is JobState.COMPLETED

    async with open_worker(driver, registry, worker_id="worker-2", **WORKER_OPTIONS):
        records = await _until(driver, ids, long_done, "demo.long completes on worker-2")
    say(f"all settled ({_counts(records)})")


async def _until(
    driver: Driver,
    ids: list[JobId],
    done: Callable[[dict[JobId, JobRecord]], bool],
    what: str,
) -> dict[JobId, JobRecord]:
    with trio.move_on_after(PATIENCE):
        while True:
            records = {job_id: await _get(driver, job_id) for job_id in ids}
            if done(records):
                return records
            await trio.sleep(POLL)
    raise _stuck(what)


async def _until_step(driver: Driver, job_id: JobId) -> None:
    with trio.move_on_after(PATIENCE):
        while not await driver.load_steps(job_id):
            await trio.sleep(POLL)
        return
    raise _stuck("demo.long records its checkpoint")


def _stuck(what: str) -> JobsError:
    return JobsError(
        f"the demo waited {PATIENCE:.0f} s for: {what}",
        fix="run `jobs-trio demo --verbose` to see the workers' log lines, and report it",
        code="X_DEMO",
    )


async def _get(driver: Driver, job_id: JobId) -> JobRecord:
    record = await driver.get(job_id)
    if record is None:
        raise _stuck(f"job {job_id} to exist")
    return record


def _counts(records: Mapping[JobId, JobRecord]) -> str:
    by_state: dict[str, int] = {}
    for record in records.values():
        by_state[record.state.value] = by_state.get(record.state.value, 0) + 1
    return ", ".join(
        f"{by_state[state]} {state}" for state in render.STATE_ORDER if state in by_state
    )


def _rows(records: list[JobRecord]) -> list[list[str]]:
    return [
        [r.name, r.state.value, render.attempts(r), render.short(r.last_error, 60)] for r in records
    ]


# What the table must show; anything else is reported, and the demo exits 1.
EXPECTED = {
    "demo.greet": (JobState.COMPLETED, 1),
    "demo.flaky": (JobState.COMPLETED, 2),
    "demo.doomed": (JobState.DEAD, 3),
    "demo.long": (JobState.COMPLETED, 1),
}


def _surprises(records: list[JobRecord]) -> list[str]:
    return [
        f"unexpected: {r.name} ended {r.state} after {r.attempts} attempt(s);"
        f" expected {EXPECTED[r.name][0]} after {EXPECTED[r.name][1]}"
        for r in records
        if (r.state, r.attempts) != EXPECTED[r.name]
    ]


def _story(records: list[JobRecord]) -> list[str]:
    greeted = sum(r.name == "demo.greet" for r in records)
    return [
        f"{greeted} demo.greet completed on their first attempt.",
        "demo.flaky failed once, waited out its backoff and completed on attempt 2.",
        "demo.doomed failed all 3 attempts and was dead-lettered: kept, and re-runnable with"
        " `jobs-trio retry ID`.",
        "demo.long was interrupted by worker-1's drain (the shutdown a SIGTERM starts) and"
        " completed on worker-2; attempts 1: the drained attempt was handed back, not counted.",
    ]
