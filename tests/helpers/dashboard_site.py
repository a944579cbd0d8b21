# A dashboard served over real HTTP on 127.0.0.1 (a free port) from a real SQLite file or a
# real PostgreSQL schema, seeded with jobs in every interesting state. Apart from the tests so
# the HTTP tests and the browser test read the same database the same way.
from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from jobs_trio._core.records import (
    AttemptNote,
    Complete,
    DeadLetter,
    NewJob,
    Retry,
    StepRecord,
    StepStatus,
    TaskAdvance,
    TaskFire,
    WorkerPresence,
    new_job_id,
)
from jobs_trio._jobs.registry import Registry
from jobs_trio.dashboard import DashboardOptions, open_dashboard_driver, serve_dashboard
from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from tests.conftest import require_postgres

# Markup, a terminal escape (retitles a window) and a bidi override: none may act on a page.
HOSTILE_NAME = '<script>alert("name")</script><img src=x onerror=alert(1)>\x1b]0;pwned\x07\u202e'
HOSTILE_ERROR = "boom <script>alert('error')</script>\nsecond line\x1b[31m"
# JSON escapes store as ASCII on every driver; decoded for display they are a NUL and a lone
# surrogate, which the page must show (a lone surrogate cannot even be encoded as UTF-8).
HOSTILE_PAYLOAD = '{"html": "</pre><script>alert(2)</script>", "nul": "\\u0000", "half": "\\udcff"}'
# The traceback the dead job's attempts stored: markup and an escape in it too.
TRACEBACK = (
    'Traceback (most recent call last):\n  File "mail.py", line 7, in broken\n'
    "RuntimeError: <b>boom</b>\x1b[31m"
)
WORKER = "test-worker"
TASK = "nightly-report"


@attrs.frozen
class Seeded:
    completed: str  # mail.welcome: two step records and a result
    dead: str  # mail.broken: dead-lettered with HOSTILE_ERROR
    hostile: str  # HOSTILE_NAME with HOSTILE_PAYLOAD, ready
    report: str  # report.build in queue "reports", ready


@attrs.frozen
class Site:
    url: str  # http://127.0.0.1:PORT
    writer: Driver  # a driver of the test's own, able to write, on the same database
    jobs: Seeded
    database: str = ""  # its URL, and the options that reach it (a PostgreSQL schema)
    options: dict[str, Any] = attrs.field(factory=dict)


def note(attempt: int, traceback: str | None = None) -> AttemptNote:
    return AttemptNote(attempt, WORKER, 0.5, traceback)


async def seed(driver: Driver) -> Seeded:
    def job(name: str, queue: str, priority: int, payload: str = "{}") -> NewJob:
        return NewJob(new_job_id(), name, queue, payload, max_attempts=3, priority=priority)

    completed, dead = (
        job("mail.welcome", "emails", 0, '{"to": "a@b.c"}'),
        job("mail.broken", "emails", 1),
    )
    hostile, report = (
        job(HOSTILE_NAME, "emails", 5, HOSTILE_PAYLOAD),
        job("report.build", "reports", 0),
    )
    await driver.enqueue([completed, dead, hostile])
    now = driver.now()
    # The report job is a cron task's fire, a minute ago: the task's record says so.
    fire = TaskFire(now - 60, report)
    assert await driver.advance_task(TaskAdvance(TASK, None, now - 60, (fire,)))
    [first] = await driver.claim(["emails"], 1, lease=60, worker_id=WORKER)
    assert first.job_id == completed.job_id
    for name, result in (("render", '"<b>hello</b>"'), ("send", '{"message_id": 42}')):
        step = StepRecord(name, StepStatus.DONE, now, now + 0.25, result=result)
        assert await driver.save_step(first.lease, step)
    await driver.settle([Complete(first.lease, result='{"sent": true}', note=note(1))])
    # The broken job: a first attempt retried at once, then dead-lettered, each with its
    # traceback in the job's history.
    [second] = await driver.claim(["emails"], 1, lease=60, worker_id=WORKER)
    assert second.job_id == dead.job_id
    await driver.settle([Retry(second.lease, 0.0, "RuntimeError: first", note=note(1, TRACEBACK))])
    [third] = await driver.claim(["emails"], 1, lease=60, worker_id=WORKER)
    assert third.job_id == dead.job_id
    await driver.settle([DeadLetter(third.lease, error=HOSTILE_ERROR, note=note(2, TRACEBACK))])
    await driver.worker_seen(
        WorkerPresence(
            worker_id=WORKER,
            host="box-1",
            pid=4242,
            queues=("emails", "reports"),
            concurrency=10,
            running=0,
            state="idle",
            version="0.2.0",
            started_at=now - 3600,
            seen_at=now,
            every=3600.0,  # live for the whole test
        )
    )
    # One row in the outbox: written by an application's transaction, not yet relayed.
    await driver.outbox_write([job("mail.later", "emails", 0)])
    return Seeded(completed.job_id, dead.job_id, hostile.job_id, report.job_id)


async def seed_history(url: str, options: dict[str, Any], minutes: int = 60) -> None:
    """An hour of work in queue "invoices" for the charts: each minute a few jobs completed and
    some failed, settled on a clock set back to that minute (a driver of its own, on the same
    database), so the charts show a past they could not otherwise have."""
    now = time.time()
    at = [now - minutes * 60]
    async with open_driver(url, clock=lambda: at[0], **options) as past:
        for minute in range(minutes):
            at[0] = now - (minutes - minute) * 60 + 1
            done, failed = 3 + (minute * 7) % 11, (minute * 5) % 4 // 2
            batch = [
                NewJob(new_job_id(), "invoice.send", "invoices", "{}", 1)
                for _ in range(done + failed)
            ]
            await past.enqueue(batch)
            claims = await past.claim(["invoices"], len(batch), lease=60, worker_id=WORKER)
            await past.settle(
                [
                    Complete(c.lease, note=note(1))
                    if n < done
                    else DeadLetter(c.lease, "ValueError: bad VAT id", note=note(1, TRACEBACK))
                    for n, c in enumerate(claims)
                ]
            )


@asynccontextmanager
async def database(kind: str, tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A database URL and the driver options that reach it (PostgreSQL: a fresh schema,
    dropped afterwards)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}", {}
        return
    import uuid

    schema = f"jt_dash_{uuid.uuid4().hex[:10]}"
    url = require_postgres()
    try:
        yield url, {"schema": schema}
    finally:
        with trio.CancelScope(shield=True):
            async with open_driver(url, schema=schema, migrate=True, drop_schema_on_close=True):
                pass


@asynccontextmanager
async def open_site(
    kind: str,
    tmp_path: Path,
    *,
    actions: bool = False,
    refresh: float = 0.0,
    registry: Registry | None = None,
) -> AsyncIterator[Site]:
    async with database(kind, tmp_path) as (url, options):
        writer_options = {**options, "migrate": True} if kind == "postgres" else options
        async with open_driver(url, **writer_options) as writer:
            jobs = await seed(writer)
            async with (
                open_dashboard_driver(url, options, actions=actions) as reader,
                trio.open_nursery() as nursery,
            ):
                served = DashboardOptions(port=0, actions=actions, refresh=refresh)
                [address] = await nursery.start(
                    functools.partial(serve_dashboard, reader, served, registry=registry)
                )
                yield Site(address, writer, jobs, url, options)
                nursery.cancel_scope.cancel()
