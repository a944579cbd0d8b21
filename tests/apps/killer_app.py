# The jobs of tests/drivers/test_worker_killer_processes.py: ordinary jobs, and one that SIGKILLs
# the worker process running it. Apart because each worker process imports it by name.
from __future__ import annotations

import os
import signal

import trio

import jobs_trio

registry = jobs_trio.Registry()


@registry.job("app.ordinary", queue="work", attempts=3)
async def ordinary(ctx: jobs_trio.JobContext, seconds: float) -> None:
    await trio.sleep(seconds)


@registry.job("app.killer", queue="work", attempts=3)
async def killer(ctx: jobs_trio.JobContext, payload: None) -> None:
    # A second into every attempt, the whole process dies, as a segfault or the OOM killer
    # would take it: nothing is written, every job it runs lapses with it.
    await trio.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)
