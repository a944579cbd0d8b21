# jobs_trio's side of the benchmark: enqueue_many for the batch, a worker as `jobs-trio worker`
# runs one (driver, lifecycle, worker; SIGTERM drains). Run by bench/run.py as a subprocess.
from __future__ import annotations

import argparse
import time
from typing import Any

import trio
from common import JOB, QUEUE, Marks, dispatch, done_order, emit, parse, payloads, read_order, ready

import jobs_trio
from jobs_trio._cli.logging_flags import configure_logging

registry = jobs_trio.Registry()
_marks: Marks | None = None
# The worker's claim_ahead: its default ("auto") when None; bench/lib_jobs_trio_ahead.py sets it.
CLAIM_AHEAD: int | None = None


# Every option at its default but the retry delay: the retries workload retries at once (each
# library alike), so it times the retry's own cost, not a backoff's wait.
@registry.job(JOB, queue=QUEUE, backoff=jobs_trio.Backoff(base=0.0, jitter=0.0))
async def handler(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    assert _marks is not None
    seconds = _marks.started(payload)
    if _marks.kind == "steps":
        for k in range(STEPS):  # durable steps, each a no-op: what a step itself costs
            await ctx.step.run(f"step{k}", _step)
    if seconds:
        await trio.sleep(seconds)


STEPS = 10


def _step() -> int:
    return 0


def _options(url: str, install: bool) -> dict[str, Any]:
    # SQLite prepares its file on every open; PostgreSQL migrates when asked.
    return {"migrate": True} if install and url.startswith("postgres") else {}


async def _enqueue(args: argparse.Namespace) -> None:
    batch = payloads(args.n, args.sleep, args.fail_every)
    async with jobs_trio.open_driver(args.db, **_options(args.db, args.install)) as driver:
        started = time.perf_counter()
        if batch:
            await handler.enqueue_many(driver, batch)
        seconds = time.perf_counter() - started
    emit({"seconds": seconds})


async def _worker(args: argparse.Namespace) -> None:
    global _marks
    # As the CLI does: its handler on stderr, the text format, INFO (a line per attempt).
    configure_logging(argparse.Namespace(log_level="info", log_format="text"))
    _marks = Marks(args.mark, args.kind)
    # As `jobs-trio worker` runs one (cli._run_worker), with every default but concurrency
    # (and claim_ahead, for the jobs_trio_ahead column).
    async with (
        jobs_trio.open_driver(args.db) as driver,
        jobs_trio.open_lifecycle(grace=25) as lifecycle,
        jobs_trio.open_worker(
            driver,
            registry,
            concurrency=args.concurrency,
            **({} if CLAIM_AHEAD is None else {"claim_ahead": CLAIM_AHEAD}),
            lifecycle=lifecycle,
        ),
    ):
        ready()
        await trio.sleep_forever()


async def _latency(args: argparse.Namespace) -> None:
    called, returned = [], []
    async with jobs_trio.open_driver(args.db) as driver:
        for i in range(args.n):
            called.append(time.monotonic())
            await handler.enqueue(driver, {"i": i})
            returned.append(time.monotonic())
            await trio.sleep(args.gap)
    emit({"called": called, "returned": returned, "loop": "trio"})


async def _load(args: argparse.Namespace) -> None:
    async with jobs_trio.open_driver(args.db) as driver:
        while (n := await trio.to_thread.run_sync(read_order)) is not None:
            await handler.enqueue_many(driver, [{}] * n)
            done_order()


def main() -> None:
    args = parse()
    commands = {"enqueue": _enqueue, "worker": _worker, "latency": _latency, "load": _load}
    dispatch(args, {name: (lambda a, f=f: trio.run(f, a)) for name, f in commands.items()})


if __name__ == "__main__":
    main()
