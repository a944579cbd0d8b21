# What one scrape of a worker's /metrics weighs when it claims from many queues (issue 46): its
# size, its series and the time to render it, after one job of each queue has run. Apart from
# dashboard_overview.py (queues a worker only observes): here every queue is the worker's own.
"""A scrape of a worker claiming from --queues queues: bytes, series, milliseconds.

    python bench/metrics_scrape.py [--queues 5000] [--reps 5]
    PYTHONPATH=/tmp/before/src python bench/metrics_scrape.py   # another checkout's

A registry of --queues jobs, each declared on a queue of its own, one job of each enqueued on
the memory driver and run by one worker claiming from every queue (each job's attempt counted,
its wait and run time observed, the queues observed once); then the worker's metrics rendered
--reps times in the text format (prometheus-client's generate_latest, what /metrics answers):
the median time, the size and the number of series. Measured here (2026-12-04, 5,000 queues):
16.2 MB, 256,668 series, 10.4 s a scrape before issue 46; after it (8bb586d, the same day),
172 KB, 2,551 series, ~50 ms a scrape (docs/metrics.md quotes it)."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest

import jobs_trio
from jobs_trio._core.metrics import Metrics


async def main(args: argparse.Namespace) -> None:
    registry = jobs_trio.Registry()
    jobs = []
    for n in range(args.queues):

        async def body(ctx: jobs_trio.JobContext, payload: Any) -> None:
            pass

        jobs.append(registry.job(f"bench.job{n:05}", queue=f"q{n:05}")(body))
    metrics = Metrics(CollectorRegistry())
    async with jobs_trio.open_driver("memory://") as driver:
        for job in jobs:
            await job.enqueue(driver, {})
        worker = jobs_trio.Worker(
            driver,
            registry,
            concurrency=1,
            metrics=metrics,
            stats_interval=0.05,
            retention=None,
            schedule_tasks=False,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            while worker.stats().outcomes[jobs_trio.OutcomeKind.COMPLETED] < args.queues:
                await trio.sleep(0.05)
            while not worker.stats().queue_depth:
                await trio.sleep(0.05)
            times, scraped = [], b""
            for _ in range(args.reps):
                began = time.perf_counter()
                scraped = generate_latest(metrics.registry)
                times.append(time.perf_counter() - began)
            await worker.stop()
    series = sum(1 for line in scraped.splitlines() if line and not line.startswith(b"#"))
    print(
        f"/metrics of a worker claiming {args.queues:,} queues: {len(scraped):,} bytes,"
        f" {series:,} series, {statistics.median(times) * 1000:,.1f} ms a scrape"
        f" (min {min(times) * 1000:,.1f}, max {max(times) * 1000:,.1f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=5)
    trio.run(main, parser.parse_args())
