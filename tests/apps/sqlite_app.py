# The jobs that tests/drivers/test_processes_sqlite.py runs in real `jobs-trio worker` processes.
# Apart from the test because each worker process imports it by name, as a user's app would be.
from __future__ import annotations

import os
from typing import Any

import trio

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("app.record", queue="bulk", attempts=3)
async def record(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    # One write(2) of one line on an O_APPEND file: atomic on a local file system, so lines
    # from three processes never interleave, and a job run twice shows up twice.
    # An optional pause first: a batch that outlasts each idle worker's next look at the file.
    await trio.sleep(payload.get("pause", 0))
    fd = os.open(payload["seen"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.job_id} {ctx.worker_id}\n".encode())
    finally:
        os.close(fd)


async def _echo(worker_id: str) -> str:
    return worker_id


@registry.job("app.hang", queue="hang", attempts=3, timeout=120)
async def hang(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, int]:
    # The step record tells the test the body is running, and remembers which worker entered
    # first. That worker hangs; any other worker (after a drain or a kill) replays the record
    # and finishes at once, whatever the attempt number (a kill's orphaning hands it back).
    entered_by = await ctx.step.run("entered", _echo, ctx.worker_id)
    if entered_by == ctx.worker_id:
        await trio.sleep(payload["seconds"])
    return {"attempt": ctx.attempt}
