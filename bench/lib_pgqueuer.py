# PgQueuer's side of the benchmark, as its docs run it: `Queries.enqueue` with lists for the
# batch, and a worker as `pgq run` runs one (`pgqueuer.run(factory)`: SIGTERM sets shutdown and
# waits for running jobs), on uvloop when it is installed, as `pgq run` does (its CLI's
# `asyncio_run`); the enqueue clients too, PgQueuer's own benchmark runs on uvloop. Concurrency
# is the entrypoint's `concurrency_limit` (enforced in SQL). `batch_size` is set to the
# concurrency: measured here, that is PgQueuer's fastest (c=1: batch 10 picks ten and runs one,
# 10x slower; c=50: batch 50 runs 1.7x batch 10). Run by bench/run.py as a subprocess, in the
# bench environment only.
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import asyncpg
import pgqueuer
from common import JOB, Marks, dispatch, emit, parse, ready
from pgqueuer import AsyncpgDriver, PgQueuer, Queries
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
        payload = _payload({"sleep": args.sleep} if args.sleep else {})
        started = time.perf_counter()
        if args.n:
            await queries.enqueue([JOB] * args.n, [payload] * args.n, [0] * args.n)
        seconds = time.perf_counter() - started
    finally:
        await conn.close()
    emit({"seconds": seconds})


def _worker(args: argparse.Namespace) -> None:
    marks = Marks(args.mark, args.kind)

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[PgQueuer]:
        conn = await asyncpg.connect(args.db)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(JOB, concurrency_limit=args.concurrency)
        async def handler(job: Job) -> None:
            seconds = marks.started(json.loads(job.payload or b"{}"))
            if seconds:
                await asyncio.sleep(seconds)

        ready()
        try:
            yield pgq
        finally:
            await conn.close()

    _run(pgqueuer.run(factory, batch_size=min(args.concurrency, 50)))


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


def main() -> None:
    dispatch(
        parse(),
        {
            "enqueue": lambda a: _run(_enqueue(a)),
            "worker": _worker,
            "latency": lambda a: _run(_latency(a)),
        },
    )


if __name__ == "__main__":
    main()
