# Jobs that go to the edges of the worker's promise (issue 32), run by `jobs-trio worker` in
# tests/run/test_edges_processes.py: a body that waits for its cancellation, one that leaves a
# thread
# behind, one that forks, one that blocks the event loop, and short ones for a busy run; and
# `edge.timed`, the fault matrix's body (tests/faults/): it records when each run starts and ends.
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import trio

import jobs_trio

# A slow application import (a large app, a cold disk): the window issue 32 found a SIGTERM
# in, before the worker listened for it.
time.sleep(float(os.environ.get("EDGES_IMPORT_SECONDS", "0")))

registry = jobs_trio.Registry()
# Each body that returns appends a line here (one write, O_APPEND: whole lines from every
# process): how the tests count bodies that returned, and where.
RETURNS = os.environ.get("EDGES_RETURNS")


def returned(job_id: str, what: str) -> None:
    if RETURNS:
        with Path(RETURNS).open("a") as out:
            out.write(f"{job_id} {what} {os.getpid()} {time.time():.6f}\n")


@registry.job("edge.wait", timeout=None, attempts=3)
async def wait(ctx: jobs_trio.JobContext, payload: None) -> None:
    await trio.sleep_forever()


def _forever() -> None:
    threading.Event().wait()


@registry.job("edge.thread", timeout=None, attempts=3)
async def leave_a_thread(ctx: jobs_trio.JobContext, payload: None) -> str:
    # Non-daemon, never ends: the interpreter waits for it at exit.
    threading.Thread(target=_forever, name="left-behind-by-edge.thread").start()
    returned(ctx.job_id, "thread")
    return "left"


@registry.job("edge.fork", timeout=None, attempts=3)
async def fork(ctx: jobs_trio.JobContext, payload: None) -> str:
    child = os.fork()
    # Both processes return: the child carries on as if it were the worker.
    returned(ctx.job_id, "child" if child == 0 else "parent")
    return "child" if child == 0 else "parent"


# Set by edge.fork-await just before it forks: the edge.beside bodies waiting on it are then
# ready to run in both processes, and the child's first scheduling pass would run them.
FORK_COMING = trio.Event()


@registry.job("edge.beside", timeout=None, attempts=3)
async def beside(ctx: jobs_trio.JobContext, payload: None) -> str:
    # Runs beside edge.fork-await: its return must be the parent's alone.
    await FORK_COMING.wait()
    returned(ctx.job_id, "beside")
    return "beside"


@registry.job("edge.fork-await", timeout=None, attempts=3)
async def fork_then_await(ctx: jobs_trio.JobContext, payload: dict[str, float]) -> str:
    await trio.sleep(payload["seconds"])  # the edge.beside bodies have started and wait
    FORK_COMING.set()
    child = os.fork()
    # The child goes back to the loop before it returns: it used to resume the other jobs.
    await trio.sleep(1.0)
    returned(ctx.job_id, "child" if child == 0 else "parent")
    return "child" if child == 0 else "parent"


@registry.job("edge.fork-sync", timeout=None, attempts=3)
def fork_in_a_thread(ctx: jobs_trio.JobContext, payload: None) -> str:
    child = os.fork()
    returned(ctx.job_id, "child" if child == 0 else "parent")
    return "child" if child == 0 else "parent"


@registry.job("edge.block", timeout=60, attempts=3)
async def block(ctx: jobs_trio.JobContext, payload: dict[str, float]) -> str:
    time.sleep(payload["seconds"])  # a synchronous client in an async body
    returned(ctx.job_id, "block")
    return "blocked"


@registry.job("edge.wedge", timeout=3, attempts=3)
async def wedge(ctx: jobs_trio.JobContext, payload: None) -> str:
    time.sleep(600)  # past its own timeout: nothing on the Trio thread can stop it
    return "never"


@registry.job("edge.hidden_block", timeout=60, attempts=3)
async def hidden_block(ctx: jobs_trio.JobContext, payload: dict[str, float]) -> str:
    # Blocks the loop from a callback of the loop's own, outside this body's frames: the lease
    # lifeline cannot tell which job blocks it.
    trio.lowlevel.current_trio_token().run_sync_soon(time.sleep, payload["seconds"])
    await trio.sleep(payload["seconds"] + 1)
    return "hidden"


@registry.job("edge.sync_quick", timeout=60, attempts=3)
def sync_quick(ctx: jobs_trio.JobContext, payload: dict[str, float]) -> str:
    time.sleep(payload["seconds"])  # in its own thread: the loop is free (unless blocked)
    return "quick"


@registry.job("edge.short", timeout=60, attempts=3)
async def short(ctx: jobs_trio.JobContext, payload: dict[str, float] | None) -> str:
    await trio.sleep(payload["seconds"] if payload else 0.02)
    returned(ctx.job_id, "short")
    return "done"


# The fault matrix's ledger (tests/faults/ledger.py reads it): each run of edge.timed appends
# "<job id> start|return|unwound <run> <time>" here, and returns its <run>, so the result the
# database kept names the one run whose ending was written.
RUNS = os.environ.get("EDGES_RUNS")


def ran(job_id: str, what: str, run: str) -> None:
    if RUNS:
        with Path(RUNS).open("a") as out:
            out.write(f"{job_id} {what} {run} {time.time():.6f}\n")


@registry.job("edge.timed", timeout=60, attempts=3)
async def timed(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> str:
    run = f"{os.getpid()}:{ctx.attempt}:{os.urandom(4).hex()}"
    ran(ctx.job_id, "start", run)
    try:
        if payload.get("block"):
            time.sleep(payload["seconds"])  # blocks the whole event loop, as edge.block does
        else:
            await trio.sleep(payload["seconds"])
    except BaseException:
        ran(ctx.job_id, "unwound", run)
        raise
    ran(ctx.job_id, "return", run)
    return run
