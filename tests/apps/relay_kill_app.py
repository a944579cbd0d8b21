# A relay process for tests/outbox/test_relay_kill_processes.py that stops dead at one step of its
# pass
# for the test to SIGKILL it there: after taking its rows (`claimed`), after writing their jobs
# (`written`), after deleting the rows (`deleted`); in place, inside the one transaction once
# its jobs are inserted (`in-transaction`) or after it committed (`committed`). It says
# `READY` once its databases are open, waits for a line on stdin, runs ONE pass, and says
# `PAUSED <step>` where it stops. Apart because each is a real process, killed for real.
from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio
from prometheus_client import CollectorRegistry

import jobs_trio
from jobs_trio._core.metrics import Metrics
from jobs_trio._core.records import NewJob


def say(line: str) -> None:
    # One write(2) of one line: read by the test from this process's stderr file.
    os.write(2, f"{line}\n".encode())


class Pausing:
    """A driver that stops the pass, for good, right after the step it was told."""

    def __init__(self, inner: Any, step: str) -> None:
        self.inner, self.step = inner, step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _after(self, step: str, answer: Any) -> Any:
        if step == self.step and answer:
            say(f"PAUSED {step}")
            await trio.sleep_forever()
        return answer

    async def outbox_claim(self, limit: int, **kw: Any) -> Any:
        taken = await self.inner.outbox_claim(limit, **kw)
        await self._after("claimed", taken.jobs)
        return taken

    async def relay_enqueue(self, jobs: Sequence[NewJob], **kw: Any) -> Any:
        return await self._after("written", await self.inner.relay_enqueue(jobs, **kw))

    async def outbox_delete(self, job_ids: Sequence[str], **kw: Any) -> Any:
        return await self._after("deleted", await self.inner.outbox_delete(job_ids, **kw))

    async def shares_outbox(self, outbox: Any) -> bool:
        return bool(await self.inner.shares_outbox(getattr(outbox, "inner", outbox)))

    async def relay_in_place(self, outbox: Any, limit: int) -> Any:
        moved = await self.inner.relay_in_place(getattr(outbox, "inner", outbox), limit)
        return await self._after("committed", moved)


def pause_sqlite_inserts(store: Any) -> None:
    """`in-transaction` on SQLite: a trigger of this connection only (TEMP) calls a function
    that never returns once the pass has inserted its first job, holding the transaction."""

    def stop_here() -> None:
        say("PAUSED in-transaction")
        time.sleep(3600)  # in the driver's worker thread, inside BEGIN IMMEDIATE

    conn: sqlite3.Connection = store._door.conn
    conn.create_function("jobs_trio_test_stop_here", 0, stop_here)
    conn.execute(
        "CREATE TEMP TRIGGER stop_after_insert AFTER INSERT ON main.jobs"
        " BEGIN SELECT jobs_trio_test_stop_here(); END"
    )


async def relay_once(app_url: str, app_schema: str, jobs_url: str, schema: str, step: str) -> None:
    app_options: dict[str, Any] = {"schema": app_schema} if app_url.startswith("postgres") else {}
    jobs_options: dict[str, Any] = {"schema": schema} if jobs_url.startswith("postgres") else {}
    async with (
        jobs_trio.open_driver(app_url, **app_options) as app_db,
        jobs_trio.open_driver(jobs_url, **jobs_options) as store,
    ):
        if step == "in-transaction" and jobs_url.startswith("sqlite"):
            pause_sqlite_inserts(store)
        # (PostgreSQL's in-transaction stop is a trigger the test made, waiting on its flag.)
        relay = jobs_trio.Relay(
            Pausing(app_db, step),  # type: ignore[arg-type]
            Pausing(store, step),  # type: ignore[arg-type]
            lease=1.0,
            metrics=Metrics(CollectorRegistry()),
        )
        say("READY")
        await trio.to_thread.run_sync(sys.stdin.readline)
        await relay._one_pass()
        say("DONE")  # the step never came: nothing to move


if __name__ == "__main__":
    trio.run(relay_once, *sys.argv[1:6])
