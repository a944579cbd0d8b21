# The jobs tests/run/test_drain_processes.py runs in real `jobs-trio worker` processes, on SQLite
# and
# PostgreSQL alike: a body that finishes in a shield after SIGTERM, and a sync body that ignores
# its cancellation. Each appends "<event> <job id> <worker id> <wall time>" lines to a file.
from __future__ import annotations

import os
import time
from typing import Any

import trio

import jobs_trio

registry = jobs_trio.Registry()


def mark(path: str, event: str, ctx: jobs_trio.JobContext) -> None:
    # One write(2) of one line on an O_APPEND file: lines from several processes never
    # interleave, and a body that ran twice shows up twice.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{event} {ctx.job_id} {ctx.worker_id} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)


@registry.job("drain.finish", queue="finish", attempts=1, timeout=120)
async def finish(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    mark(payload["marks"], "start", ctx)
    # Its last step must not be cut short: it runs in a shield, hears the drain by reading
    # ctx.cancel_reason, and finishes one second later.
    with trio.CancelScope(shield=True):
        while ctx.cancel_reason is None:
            await trio.sleep(0.02)
        await trio.sleep(1)
    reason = ctx.cancel_reason
    assert reason is not None  # the loop above ended on it
    mark(payload["marks"], "end", ctx)
    return {"done": True, "reason": reason.code}


def started_before(path: str, job_id: str) -> bool:
    """Whether a run of ``job_id`` started already (its start line is in the marks file): the
    attempt number does not say, a worker's death hands the attempt back (orphaned)."""
    try:
        with open(path) as marks:
            return any(line.startswith(f"start {job_id} ") for line in marks)
    except FileNotFoundError:
        return False


@registry.job("drain.crunch", queue="crunch", attempts=3, timeout=120)
def crunch(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, int]:
    first = not started_before(payload["marks"], ctx.job_id)
    mark(payload["marks"], "start", ctx)
    if first:
        time.sleep(payload["seconds"])  # never calls ctx.check_cancelled()
    mark(payload["marks"], "end", ctx)
    return {"attempt": ctx.attempt}


@registry.job("drain.wait", queue="wait", attempts=3, timeout=120)
async def wait(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    mark(payload["marks"], "start", ctx)
    await trio.sleep(60)
