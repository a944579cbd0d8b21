# What the dashboard's overview costs with many queues (issue 36), and what /metrics weighs:
# the page's time and size, in this process through the ASGI app, and a scrape's size and series.
# Apart from run.py (throughput between libraries): this measures an operator's page.
"""The dashboard's overview (`GET /`) and a worker's /metrics, with 10,000 queues.

    python bench/dashboard_overview.py                     # SQLite, 10,000 queues
    python bench/dashboard_overview.py --db postgresql://postgres@127.0.0.1/postgres
    PYTHONPATH=/tmp/before/src python bench/dashboard_overview.py   # another checkout's

A fresh database (SQLite: a temporary file; PostgreSQL: a schema of its own, dropped after)
with one ready job in each of --queues queues. The overview is fetched --reps times through the
ASGI app on a read-only driver (no socket, no browser: the server's own time), and the median
time and the page's size printed; then what the worker's metrics export once they have
observed those queues (one observation, as every worker makes at its start).

Measured here (2026-12-02, 10,000 queues, load ~3 on 2 cores; the median of 3 before, of 5
after; PYTHONPATH=<a clone at efc8824>/src for before):

| | before issue 36 | after |
|---|---|---|
| overview, SQLite | 12,214 ms, 16,892,366 bytes | 379 ms, 56,826 bytes |
| overview, PostgreSQL | 51,252 ms, 16,912,366 bytes | 525 ms, 56,826 bytes |
| /metrics (either) | 1,444,303 bytes, 30,004 series | 54,704 bytes, 910 series |

Before, the overview read each queue's completed jobs for its sparkline (10,000 reads) and
rendered a row per queue; now six reads in all and the 100 busiest queues. The numbers are
printed, never asserted (tests/ops/test_dashboard.py checks the page's size and rows)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import trio
from prometheus_client import CollectorRegistry, generate_latest

from jobs_trio._core.metrics import Metrics
from jobs_trio._core.records import NewJob, new_job_id
from jobs_trio.dashboard import dashboard_app, open_dashboard_driver
from jobs_trio.drivers._open_driver import open_driver


async def measure(url: str, options: dict[str, object], queues: int, reps: int) -> None:
    writer_options = {**options, "migrate": True} if url.startswith("postgres") else options
    async with open_driver(url, **writer_options) as writer:
        for start in range(0, queues, 1000):
            await writer.enqueue(
                [
                    NewJob(new_job_id(), "bench.job", f"q{n:05}", "{}", 3)
                    for n in range(start, min(start + 1000, queues))
                ]
            )
        stats = await writer.stats()
    async with open_dashboard_driver(url, options, actions=False) as reader:
        app = dashboard_app(reader)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            times, size = [], 0
            for _ in range(reps):
                began = time.perf_counter()
                page = await client.get("/")
                times.append(time.perf_counter() - began)
                assert page.status_code == 200, page.text[:500]
                size = len(page.content)
    print(
        f"overview, {queues:,} queues: {statistics.median(times) * 1000:,.0f} ms"
        f" (min {min(times) * 1000:,.0f}, max {max(times) * 1000:,.0f}), {size:,} bytes"
    )
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.queues_observed(stats)
    scraped = generate_latest(registry)
    series = sum(1 for line in scraped.splitlines() if line and not line.startswith(b"#"))
    print(f"/metrics after one observation: {len(scraped):,} bytes, {series:,} series")


async def main(args: argparse.Namespace) -> None:
    if args.db.startswith("sqlite"):
        with tempfile.TemporaryDirectory() as folder:
            await measure(f"sqlite:///{Path(folder) / 'jobs.db'}", {}, args.queues, args.reps)
        return
    schema = f"bench_dash_{uuid.uuid4().hex[:8]}"
    try:
        await measure(args.db, {"schema": schema}, args.queues, args.reps)
    finally:
        async with open_driver(args.db, schema=schema, migrate=True, drop_schema_on_close=True):
            pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", default="sqlite")
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    trio.run(main, parser.parse_args())
