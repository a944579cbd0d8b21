# The jobs of the upgrade test, written against the previous release's public API so that a
# worker of either release runs them (the previous release imports this file from
# old_release.py, this one from test_upgrade.py). Each run, step and cron fire appends a line to
# the ledger file the test names in $UPGRADE_LEDGER: how runs are counted across processes.
from __future__ import annotations

import json
import os
from typing import Any

import trio

import jobs_trio

# 0.1 has no __version__.
RELEASE = getattr(jobs_trio, "__version__", "0.1.0")

# The queues one worker alone serves: a job there shows which worker of which release ran it.
ONLY_A, ONLY_B, ONLY_NEW = "old-a", "old-b", "new"


def write(line: dict[str, Any]) -> None:
    """One ledger line, by one write() to a file opened for appending: whole, whatever other
    process writes beside it."""
    line.update(pid=os.getpid(), release=RELEASE)
    fd = os.open(os.environ["UPGRADE_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def note(kind: str, ctx: jobs_trio.JobContext, **fields: Any) -> None:
    write({"kind": kind, "job": ctx.job_id, "name": ctx.name, "attempt": ctx.attempt, **fields})


def stepped(job: str, step: str) -> str:
    """A step's body: a line each time it really runs (a replay returns its record instead)."""
    write({"kind": "step", "job": job, "step": step})
    return f"{step} by {RELEASE}"


def ledger(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def make_registry(*, with_future: bool) -> jobs_trio.Registry:
    """The jobs; ``with_future`` adds one the new release knows and the previous one does not
    (it parks it). attempts=1 throughout: an attempt charged twice would dead-letter a job."""
    registry = jobs_trio.Registry()

    @registry.job("up.work", attempts=1)
    async def work(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
        note("run", ctx)
        return payload

    @registry.job("up.on_a", queue=ONLY_A, attempts=1)
    async def on_a(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
        note("run", ctx)

    @registry.job("up.on_b", queue=ONLY_B, attempts=1)
    async def on_b(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
        note("run", ctx)

    @registry.job("up.on_new", queue=ONLY_NEW, attempts=1)
    async def on_new(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
        note("run", ctx)

    @registry.job("up.slow", attempts=1)
    async def slow(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
        """Running on the previous release's worker while the migration runs."""
        await trio.sleep(payload["seconds"])
        note("run", ctx)  # at its end: a run a drain cut short is not one

    @registry.job("up.flaky", attempts=1)
    async def flaky(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> str:
        """Dead-lettered before the upgrade; once $UPGRADE_MARKS/flaky-ok exists, a retry
        runs to the end."""
        note("run", ctx)
        if not os.path.exists(os.path.join(os.environ["UPGRADE_MARKS"], "flaky-ok")):
            raise RuntimeError("not before the upgrade")
        return "ok"

    @registry.job("up.sleeper", attempts=1)
    async def sleeper(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> list[str]:
        """Asleep across the upgrade: its first step's result comes back from its record."""
        note("run", ctx)
        before = await ctx.step.run("before", stepped, ctx.job_id, "before")
        await ctx.step.sleep("nap", payload["nap"])
        after = await ctx.step.run("after", stepped, ctx.job_id, "after")
        return [before, after]

    @registry.job("up.waiter", attempts=1)
    async def waiter(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> list[Any]:
        """Waiting across the upgrade for an event the new release sends."""
        note("run", ctx)
        before = await ctx.step.run("before", stepped, ctx.job_id, "before")
        paid = await ctx.step.wait_for_event("paid", "up.paid", match=payload["order"])
        return [before, paid]

    @registry.task("up.tick", every=1)
    async def tick(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
        note("tick", ctx, scheduled=payload["scheduled_ts"])

    if with_future:

        @registry.job("up.future", queue=ONLY_NEW, attempts=1)
        async def future(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
            note("run", ctx)

    return registry
