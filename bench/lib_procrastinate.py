# Procrastinate's side of the benchmark, as its docs run it: an App on a PsycopgConnector,
# `batch_defer_async` for the batch, `defer_async` for single jobs, and a worker by
# `run_worker_async(concurrency=...)` (SIGTERM: waits for running jobs; with the default
# shutdown_graceful_timeout=None, for as long as they take). The worker's pool is sized as its
# docs advise for short jobs ("Mind the size of your PostgreSQL pool": as many connections as
# the concurrency, plus one); BENCH_PROCRASTINATE_POOL=default keeps psycopg_pool's default
# (4) for an A/B run. Run by bench/run.py as a subprocess, in the bench environment only.
from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import procrastinate
from common import JOB, QUEUE, Marks, dispatch, done_order, emit, parse, payloads, read_order, ready

_marks: Marks | None = None


def _app(url: str, concurrency: int | None = None) -> procrastinate.App:
    sized: dict[str, int] = {}
    if concurrency is not None and os.environ.get("BENCH_PROCRASTINATE_POOL") != "default":
        sized = {"max_size": concurrency + 1, "min_size": min(4, concurrency + 1)}
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url, **sized))

    # retry: its documented RetryStrategy, one retry at once (wait=0): the retries workload
    # retries without a backoff's wait, each library alike; no other workload fails a job.
    @app.task(name=JOB, queue=QUEUE, retry=procrastinate.RetryStrategy(max_attempts=3, wait=0))
    async def handler(**payload: Any) -> None:
        assert _marks is not None
        seconds = _marks.started(payload)
        if seconds:
            await asyncio.sleep(seconds)

    return app


async def _enqueue(args: argparse.Namespace) -> None:
    app = _app(args.db)
    async with app.open_async():
        if args.install:
            await app.schema_manager.apply_schema_async()
        task = app.tasks[JOB]
        batch = payloads(args.n, args.sleep, args.fail_every)
        started = time.perf_counter()
        if args.n:
            await task.batch_defer_async(*batch)
        seconds = time.perf_counter() - started
    emit({"seconds": seconds})


async def _worker(args: argparse.Namespace) -> None:
    global _marks
    _marks = Marks(args.mark, args.kind)
    app = _app(args.db, args.concurrency)
    async with app.open_async():
        ready()
        await app.run_worker_async(queues=[QUEUE], concurrency=args.concurrency)


async def _latency(args: argparse.Namespace) -> None:
    app = _app(args.db)
    called, returned = [], []
    async with app.open_async():
        task = app.tasks[JOB]
        for i in range(args.n):
            called.append(time.monotonic())
            await task.defer_async(i=i)
            returned.append(time.monotonic())
            await asyncio.sleep(args.gap)
    emit({"called": called, "returned": returned, "loop": "asyncio"})


async def _load(args: argparse.Namespace) -> None:
    app = _app(args.db)
    async with app.open_async():
        task = app.tasks[JOB]
        while (n := await asyncio.to_thread(read_order)) is not None:
            await task.batch_defer_async(*[{}] * n)
            done_order()


def main() -> None:
    commands = {"enqueue": _enqueue, "worker": _worker, "latency": _latency, "load": _load}
    dispatch(parse(), {name: (lambda a, f=f: asyncio.run(f(a))) for name, f in commands.items()})


if __name__ == "__main__":
    main()
