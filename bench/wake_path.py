# Where an idle worker's reaction to one enqueue goes, stage by stage, on PostgreSQL: an in-process
# worker with timestamps patched into the driver, fed single enqueues by another process.
"""Time the wake-up path of an idle jobs_trio worker (concurrency 10), stage by stage.

    python bench/wake_path.py [--n 200] [--gap 0.03]

Creates (and drops) a database ``bench_wake_path``; the worker runs in this process with
timestamps (CLOCK_MONOTONIC) patched in at: the NOTIFY's callback, the waiters woken, the claim
sent and answered (non-empty claims only), the handler's start. The enqueues come one at a time,
GAP apart, from ``bench/lib_jobs_trio.py latency`` in a process of its own (as bench/run.py's
latency workload sends them), which answers each call's start and return. Stages are matched by
order (one job at a time). Prints p50/p90 of each stage. To compare trees, run it with
PYTHONPATH=<tree>/src."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import trio

import jobs_trio
from jobs_trio.drivers import _postgres_listener as postgres_listener
from jobs_trio.drivers import postgres

HERE = Path(__file__).resolve().parent
ADMIN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
NAME = "bench_wake_path"
STAGES = ("notify", "woken", "claim_sent", "claim_answered", "started")
marks: dict[str, list[float]] = {stage: [] for stage in STAGES}
registry = jobs_trio.Registry()


@registry.job("bench.job", queue="bench")
async def handler(ctx: jobs_trio.JobContext, payload: Any) -> None:
    marks["started"].append(time.monotonic())


def patch() -> None:
    """Timestamps around the driver's own methods (only this process's, only this run)."""
    listener = postgres_listener.Listener
    on_notify, wake = listener._on_notify, listener.wake

    def _on_notify(self: Any, *args: Any) -> None:
        marks["notify"].append(time.monotonic())
        on_notify(self, *args)

    def _wake(self: Any, queue: str | None) -> None:
        if queue is not None:
            marks["woken"].append(time.monotonic())
        wake(self, queue)

    claim = postgres.PostgresDriver.claim

    async def _claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent = time.monotonic()
        claims = await claim(self, *args, **kwargs)
        if claims:
            marks["claim_sent"].append(sent)
            marks["claim_answered"].append(time.monotonic())
        return claims

    listener._on_notify = _on_notify  # type: ignore[method-assign]
    listener.wake = _wake  # type: ignore[method-assign]
    postgres.PostgresDriver.claim = _claim  # type: ignore[method-assign]


async def admin(sql: str) -> None:
    def run() -> None:
        import asyncio

        async def go() -> None:
            conn = await asyncpg.connect(ADMIN)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        asyncio.run(go())

    await trio.to_thread.run_sync(run)


@contextlib.asynccontextmanager
async def a_database(name: str) -> AsyncIterator[str]:
    """A fresh database ``name`` with jobs_trio's schema (its URL), dropped after."""
    url = ADMIN.rsplit("/", 1)[0] + "/" + name
    await admin(f"DROP DATABASE IF EXISTS {name}")
    await admin(f"CREATE DATABASE {name}")
    try:
        async with jobs_trio.open_driver(url, migrate=True):
            pass
        yield url
    finally:
        await admin(f"DROP DATABASE IF EXISTS {name}")


async def single_enqueues(url: str, n: int, gap: float) -> dict[str, Any]:
    """``n`` enqueues ``gap`` apart from bench/lib_jobs_trio.py's latency command, in a process of
    its own: its answer (each call's start and return, ``called`` and ``returned``)."""
    command = [sys.executable, str(HERE / "lib_jobs_trio.py"), "latency", "--db", url]
    done = await trio.run_process(
        [*command, "--n", str(n), "--gap", str(gap)], capture_stdout=True, cwd=str(HERE)
    )
    answer: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return answer


async def main(args: argparse.Namespace) -> None:
    async with a_database(NAME) as url:
        patch()
        async with (
            jobs_trio.open_driver(url) as driver,
            jobs_trio.open_worker(driver, registry, concurrency=10, drain_on_shutdown=False),
        ):
            await trio.sleep(0.5)  # idle, as bench/run.py's latency workload leaves it
            answer = await single_enqueues(url, args.n, args.gap)
            await trio.sleep(0.5)
    stages = {"called": answer["called"], "returned": answer["returned"], **marks}
    n = min(len(v) for v in stages.values())
    for a, b in (
        ("called", "returned"),
        ("returned", "notify"),
        ("notify", "woken"),
        ("woken", "claim_sent"),
        ("claim_sent", "claim_answered"),
        ("claim_answered", "started"),
        ("returned", "started"),
    ):
        ms = sorted((stages[b][i] - stages[a][i]) * 1000 for i in range(n))
        print(
            f"{a + ' -> ' + b:32} p50 {statistics.median(ms):7.3f} ms"
            f"  p90 {ms[int(n * 0.9)]:7.3f} ms"
        )
    print(f"({n} jobs; {jobs_trio.__file__})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.03)
    trio.run(main, parser.parse_args())
