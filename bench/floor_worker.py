# The floor of the worker's shape: the least a worker can do per no-op job and still be this
# design. Apart from worker_cpu.py so both run on one machine in one hour and can be compared.
"""A minimal worker of the worker's shape, its process CPU per no-op job (issue 44).

    python bench/floor_worker.py [--jobs 20000] [--concurrency 50] [--batch 100]
    python bench/floor_worker.py --db sqlite:////tmp/f.db ...

What it keeps of the worker: a Trio task per job with its own cancel scope and deadline (the
job's timeout, 60 s), the payload decoded, the body awaited, a ``Complete`` with its attempt
note per job carried by the next claim (the project's own ``settle_and_claim``, over its own
bridge on PostgreSQL), the same INFO line per attempt through the same handler (the CLI's,
its route decided once), and a count per attempt. What it drops: everything that makes the
worker reliable (drain, leases renewed, claims ahead handed back, fencing of late claims,
metrics' histograms, retries, thread bodies, cancel reasons, fork checks). The gap between
``bench/worker_cpu.py`` and this, in one hour, is what the worker's bookkeeping costs."""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import time
from typing import Any

import trio
from common import CollectorTime
from worker_cpu import _drop

import jobs_trio
from jobs_trio._cli.logging_flags import configure_logging
from jobs_trio._core.logs import _ROUTE, AttemptLine, FlushHeldLines
from jobs_trio._core.records import AttemptNote, Complete, Settlement

QUEUE = "bench_worker_cpu"  # the worker's: one INFO line's text for both
# Its own, and this process's: run beside worker_cpu.py, neither drops the other's.
SCHEMA = f"bench_floor_worker_{os.getpid()}"
registry = jobs_trio.Registry()


@registry.job("bench.worker_cpu", queue=QUEUE)
async def noop(ctx: Any, payload: Any) -> None:
    return None


async def main(args: argparse.Namespace) -> None:
    sqlite = args.db.startswith("sqlite:")
    where: dict[str, Any] = {} if sqlite else {"schema": SCHEMA}
    async with jobs_trio.open_driver(args.db, migrate=True, **where) as driver:
        await noop.enqueue_many(driver, [{"i": i} for i in range(args.jobs)])
        if not sqlite:
            await driver.bridge.run(  # type: ignore[attr-defined]
                lambda conn: conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs"), what="analyze"
            )
    try:
        async with jobs_trio.open_driver(args.db, **where) as driver:
            wall, cpu = time.perf_counter(), time.process_time()
            with CollectorTime() as collector:
                await _floor(driver, args)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(
            f"floor c={args.concurrency} batch={args.batch} {args.jobs / wall:,.0f} jobs/s,"
            f" {cpu / args.jobs * 1e6:,.0f} µs CPU a job, {collector.per_job(args.jobs)}"
            f" (load {os.getloadavg()[0]:.2f})"
        )
    finally:
        await _drop(args.db, sqlite, SCHEMA)


async def _floor(driver: Any, args: argparse.Namespace) -> None:
    take_attempt = _ROUTE.attempt_taker()  # decided once: nothing changes it here
    # Held lines written as the loop waits for I/O, as the worker writes them.
    trio.lowlevel.add_instrument(FlushHeldLines())
    line = AttemptLine("jobs.attempt.completed", "bench.worker_cpu", QUEUE)
    done: list[Settlement] = []
    held: collections.deque[Any] = collections.deque()
    counts = {"completed": 0}
    running = 0
    finished = 0
    room = trio.Event()
    all_done = trio.Event()
    worker_id = "floor"

    async def run(nursery: trio.Nursery, claim: Any) -> None:
        nonlocal running, finished
        started = trio.current_time()
        with trio.CancelScope(relative_deadline=60.0):
            await noop.fn(None, json.loads(claim.payload))
        seconds = trio.current_time() - started
        done.append(Complete(claim.lease, "null", AttemptNote(claim.attempt, worker_id, seconds)))
        counts["completed"] += 1
        if take_attempt is not None:
            take_attempt(line, claim.job_id, claim.attempt, seconds)
        running -= 1
        finished += 1
        if held:
            running += 1
            nursery.start_soon(run, nursery, held.popleft())
        if finished == args.jobs:
            all_done.set()
        elif len(held) < args.batch // 2:
            room.set()

    async with trio.open_nursery() as nursery:
        while finished + running + len(held) < args.jobs:
            carried, done[:] = list(done), []
            _, claims = await driver.settle_and_claim(
                carried, [QUEUE], args.batch, lease=60.0, worker_id=worker_id
            )
            held.extend(claims)
            while held and running < args.concurrency:
                running += 1
                nursery.start_soon(run, nursery, held.popleft())
            if len(held) >= args.batch // 2:
                room = trio.Event()
                await room.wait()
            elif not claims:
                await trio.sleep(0.001)
        await all_done.wait()
    if done:
        await driver.settle(done)
    flush = getattr(logging.getLogger().handlers[0], "flush", None)
    if flush is not None:
        flush()


def run_from_command_line() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--batch", type=int, default=100, help="jobs a claim asks for")
    options = parser.parse_args()
    configure_logging(argparse.Namespace(log_level="info", log_format="text"))
    trio.run(main, options)


if __name__ == "__main__":
    run_from_command_line()
