# The jobs that tests/drivers/test_processes_postgres.py runs in real `jobs-trio worker` processes.
# Apart from the test because each worker process imports it by name, as a user's app would be;
# apart from sqlite_app because here a job interrupted or killed must then complete elsewhere.
from __future__ import annotations

from typing import Any

import trio

import jobs_trio
from tests.apps import sqlite_app

registry = jobs_trio.Registry()


@registry.job("app.record", queue="bulk", attempts=3)
async def record(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    # sqlite_app's body: its optional pause (a steady stream of jobs that lasts long enough to
    # be disturbed), then the line "<job id> <worker id>" (one atomic append).
    await sqlite_app.record.fn(ctx, payload)


async def _echo(worker_id: str) -> str:
    return worker_id


@registry.job("app.hang", queue="hang", attempts=3, timeout=120)
async def hang(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, int]:
    # The step record tells the test the body is running, and remembers which worker entered
    # first. That worker hangs; any other worker (after a drain or a kill) replays the record
    # and finishes at once, whatever the attempt number.
    entered_by = await ctx.step.run("entered", _echo, ctx.worker_id)
    if entered_by == ctx.worker_id:
        await trio.sleep(payload["seconds"])
    return {"attempt": ctx.attempt}
