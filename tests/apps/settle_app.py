# The jobs that tests/run/test_settle_faults.py runs in real `jobs-trio worker` processes: good
# jobs,
# poison ones (errors with NUL and lone surrogates, a result the database refuses), a job held
# until the test lets it return, and one that logs when it starts and stops.
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import trio

import jobs_trio

registry = jobs_trio.Registry()

# A result holding this is refused by a trigger the test installs: a real refusal by the
# database, on SQLite and PostgreSQL alike.
POISON_MARK = "POISON-RESULT"


def _append(path: str, line: str) -> None:
    # One write(2) on an O_APPEND file: lines from several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@registry.job("settle.ok", queue="settle", attempts=3)
async def ok(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, int]:
    _append(payload["seen"], ctx.job_id)
    await trio.sleep(payload.get("pause", 0.01))
    return {"n": payload["n"]}


@registry.job("settle.nul", queue="settle", attempts=1)
async def nul(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    raise ValueError("bad byte \x00 in input")


@registry.job("settle.surrogate", queue="settle", attempts=1)
async def surrogate(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    # What os.listdir gives for a file name that is not UTF-8.
    raise FileNotFoundError(b"/data/\xff.csv".decode("utf-8", "surrogateescape"))


@registry.job("settle.refused", queue="settle", attempts=1)
async def refused(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, str]:
    return {"mark": POISON_MARK}


@registry.job("settle.hold", queue="hold", attempts=3, timeout=120)
async def hold(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, bool]:
    """Says it runs (``entered``), waits until the file ``release`` exists, then says it is
    returning (``returned``) and returns."""
    Path(payload["entered"]).touch()
    while not Path(payload["release"]).exists():
        await trio.sleep(0.02)
    Path(payload["returned"]).touch()
    return {"held": True}


@registry.job("settle.span", queue="span", attempts=10, timeout=120)
async def span(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    """Logs "<worker> start <t>" and "<worker> end <t>" (wall clock) around ``seconds`` of work,
    so the test can see whether two runs of it ever overlapped. The first run takes
    ``first_seconds`` when given: long enough to be running whenever the test gets round to
    taking its lock, however loaded the machine."""
    first = not Path(payload["log"]).exists()
    _append(payload["log"], f"{ctx.worker_id} start {time.time():.6f}")
    try:
        await trio.sleep(
            payload.get("first_seconds", payload["seconds"]) if first else payload["seconds"]
        )
    finally:
        _append(payload["log"], f"{ctx.worker_id} end {time.time():.6f}")
