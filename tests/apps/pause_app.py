# The jobs of the pause tests in real worker processes (issue 46): for the dashboard's, one on the
# queue the test pauses and one canary per worker on a queue of its own, whose run shows that
# worker claimed again after the pause; for tests/run/test_pause_processes.py, a long job that
# holds its slot until told and quick ones held behind it, each marking its start in a file.
# Apart because the CLI imports it by name.
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import trio

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("pause.mail", queue="mail")
async def mail(ctx: jobs_trio.JobContext, payload: Any) -> str:
    return f"sent {payload}"


@registry.job("pause.canary_a", queue="canary-a")
async def canary_a(ctx: jobs_trio.JobContext, payload: Any) -> str:
    return "a"


@registry.job("pause.canary_b", queue="canary-b")
async def canary_b(ctx: jobs_trio.JobContext, payload: Any) -> str:
    return "b"


@registry.job("pause.long", queue="held")
async def long(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
    Path(payload["started"]).touch()
    while not Path(payload["release"]).exists():
        await trio.sleep(0.005)


@registry.job("pause.quick", queue="held")
async def quick(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
    # One write(2) on an O_APPEND file: a body that started is never missed.
    fd = os.open(payload["marks"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{ctx.job_id} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)
