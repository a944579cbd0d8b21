# PostgreSQL's CPU a job for what a busy worker sends it: batches of completions settled with the
# next claim, through the driver, no worker. Apart from worker_cpu.py because this isolates the
# server's share (the client's Python is not run), which is most of a job's CPU at c=50.
"""PostgreSQL server CPU a job for claim + settle batches, through the driver alone.

    python bench/server_cpu.py [--jobs 20000] [--batch 150] [--reps 3]
    PYTHONPATH=/old/tree/src python bench/server_cpu.py ...   # the same, another tree

Enqueues N no-op jobs into a schema of its own (`bench_server_cpu`, dropped at the end), runs
VACUUM ANALYZE, then loops as a worker at concurrency ``--batch`` does when every job is a
no-op: ``settle_and_claim`` of the last batch's completions (each with its attempt note, as a
worker writes them) and the next batch, until the queue is empty. Prints the CPU every process
named ``postgres`` spent meanwhile, per job (10 ms ticks: use thousands of jobs; a process
that ended meanwhile is left out, so on a busy server it reads a little low), and the
client's. ``--reps`` repeats the whole (enqueue, loop) and prints each."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import trio
from common import postgres_cpu_by_pid, postgres_spent

import jobs_trio
from jobs_trio._core.records import AttemptNote, Complete

SCHEMA = "bench_server_cpu"
QUEUE = "bench_server_cpu"
WORKER = "bench:server-cpu"


async def one(args: argparse.Namespace) -> tuple[float, float, float]:
    """One enqueue and drain: (server CPU a job, client CPU a job, jobs/s) in seconds."""
    registry = jobs_trio.Registry()

    @registry.job("bench.server_cpu", queue=QUEUE)
    async def noop(ctx: jobs_trio.JobContext, payload: Any) -> None:
        return None

    async with jobs_trio.open_driver(args.db, migrate=True, schema=SCHEMA) as driver:
        try:
            await noop.enqueue_many(driver, [{"i": i} for i in range(args.jobs)])
            await driver.bridge.run(  # type: ignore[attr-defined]
                lambda conn: conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs"), what="analyze"
            )
            server, cpu, wall = postgres_cpu_by_pid(), time.process_time(), time.perf_counter()
            done = 0
            claims = await driver.claim([QUEUE], args.batch, lease=30.0, worker_id=WORKER)
            while claims:
                settlements = [
                    Complete(c.lease, None, AttemptNote(c.attempt, WORKER, 0.000123))
                    for c in claims
                ]
                done += len(settlements)
                _, claims = await driver.settle_and_claim(
                    settlements, [QUEUE], args.batch, lease=30.0, worker_id=WORKER
                )
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            spent = postgres_spent(server, postgres_cpu_by_pid())
            if done != args.jobs:
                raise SystemExit(f"settled {done} of {args.jobs} jobs")
            return (float("nan") if spent is None else spent / done), cpu / done, done / wall
        finally:
            await driver.bridge.run(  # type: ignore[attr-defined]
                lambda conn: conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE"), what="drop"
            )


async def main(args: argparse.Namespace) -> None:
    for _ in range(args.reps):
        server, client, rate = await one(args)
        print(
            f"batch {args.batch}: PostgreSQL {server * 1e6:,.1f} µs a job, client"
            f" {client * 1e6:,.1f} µs, {rate:,.0f} jobs/s (load {os.getloadavg()[0]:.2f};"
            f" {jobs_trio.__file__})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=150)
    parser.add_argument("--reps", type=int, default=3)
    trio.run(main, parser.parse_args())
