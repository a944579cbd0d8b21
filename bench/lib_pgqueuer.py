# PgQueuer's side of the benchmark, as its docs run it: `Queries.enqueue` with lists for the
# batch, and a worker as `pgq run` runs one (`pgqueuer.run(factory)`: SIGTERM sets shutdown and
# waits for running jobs), on uvloop when it is installed, as `pgq run` does (its CLI's
# `asyncio_run`); the enqueue clients too, PgQueuer's own benchmark runs on uvloop. Concurrency
# c is the runner's own cap, `max_concurrent_tasks=c` (`pgq run --max-concurrent-tasks`), with
# `batch_size=c//2`, the largest its rule allows (the cap at least twice the batch); measured
# here, about twice as fast at c=50 as a per-entrypoint `concurrency_limit=c`, which PgQueuer
# enforces fleet-wide in SQL (BENCH_PGQUEUER_LIMIT=entrypoint runs that for an A/B). c=1 cannot
# be a runner cap (2 at least), so it is `concurrency_limit=1` with `batch_size=1` (batch 10
# picks ten and runs one: 10x slower). Run by bench/run.py as a subprocess, in the bench
# environment only.
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import timedelta
from typing import Any

import asyncpg
import pgqueuer
from common import JOB, Marks, dispatch, done_order, emit, parse, payloads, read_order, ready
from pgqueuer import AsyncpgDriver, PgQueuer, Queries
from pgqueuer.executors import DatabaseRetryEntrypointExecutor, EntrypointExecutorParameters
from pgqueuer.models import Job

try:  # as pgqueuer.adapters.cli.cli.asyncio_run chooses its loop
    import uvloop

    _run: Callable[[Coroutine[Any, Any, Any]], Any] = uvloop.run
    LOOP = "uvloop"
except ImportError:
    _run = asyncio.run
    LOOP = "asyncio"


def _payload(obj: dict[str, object]) -> bytes:
    return json.dumps(obj).encode()


async def _enqueue(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.db)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if args.install:
            await queries.install()
        batch = [_payload(p) for p in payloads(args.n, args.sleep, args.fail_every)]
        started = time.perf_counter()
        if args.n:
            await queries.enqueue([JOB] * args.n, batch, [0] * args.n)
        seconds = time.perf_counter() - started
    finally:
        await conn.close()
    emit({"seconds": seconds})


def _worker(args: argparse.Namespace) -> None:
    marks = Marks(args.mark, args.kind)
    runner = os.environ.get("BENCH_PGQUEUER_LIMIT") != "entrypoint" and args.concurrency >= 2
    limit = {} if runner else {"concurrency_limit": args.concurrency}
    options = (
        {"batch_size": args.concurrency // 2, "max_concurrent_tasks": args.concurrency}
        if runner
        else {"batch_size": min(args.concurrency, 50)}
    )

    if args.kind == "flaky":
        # Its documented durable retry (the job back in the table, attempts counted), at once:
        # each library alike retries without a backoff's wait in this workload.
        def retrying(parameters: EntrypointExecutorParameters) -> DatabaseRetryEntrypointExecutor:
            return DatabaseRetryEntrypointExecutor(
                parameters=parameters, max_attempts=3, initial_delay=timedelta(0)
            )

        limit = {**limit, "executor_factory": retrying}

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[PgQueuer]:
        conn = await asyncpg.connect(args.db)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(JOB, **limit)
        async def handler(job: Job) -> None:
            seconds = marks.started(json.loads(job.payload or b"{}"))
            if seconds:
                await asyncio.sleep(seconds)

        ready()
        try:
            yield pgq
        finally:
            await conn.close()

    _run(pgqueuer.run(factory, **options))


async def _latency(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.db)
    called, returned = [], []
    try:
        queries = Queries(AsyncpgDriver(conn))
        for i in range(args.n):
            called.append(time.monotonic())
            await queries.enqueue(JOB, _payload({"i": i}))
            returned.append(time.monotonic())
            await asyncio.sleep(args.gap)
    finally:
        await conn.close()
    emit({"called": called, "returned": returned, "loop": LOOP})


async def _load(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.db)
    try:
        queries = Queries(AsyncpgDriver(conn))
        payload = _payload({})
        while (n := await asyncio.to_thread(read_order)) is not None:
            await queries.enqueue([JOB] * n, [payload] * n, [0] * n)
            done_order()
    finally:
        await conn.close()


def main() -> None:
    dispatch(
        parse(),
        {
            "load": lambda a: _run(_load(a)),
            "enqueue": lambda a: _run(_enqueue(a)),
            "worker": _worker,
            "latency": lambda a: _run(_latency(a)),
        },
    )


if __name__ == "__main__":
    main()
