# `/metrics` served from a Trio task (issue 17): the API call an application embeds, and a real
# `jobs-trio worker --metrics-port` process scraped while it runs jobs.
from __future__ import annotations

import functools
import re
import signal
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry, Counter

from jobs_trio._core.metrics_endpoint import serve_metrics
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.sqlite_app import registry as app_registry
from tests.helpers.process_helpers import started, until, worker_processes


async def test_serve_metrics_answers_a_scrape_in_both_formats_and_only_at_metrics() -> None:
    registry = CollectorRegistry()
    Counter("demo_things", "Things", registry=registry).inc(3)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve_metrics, 0, registry=registry))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            text = await client.get("/metrics")
            assert text.status_code == 200
            assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert "demo_things_total 3.0" in text.text
            # Prometheus asks for OpenMetrics when it can read it.
            accept = "application/openmetrics-text; version=1.0.0"
            open_metrics = await client.get("/metrics", headers={"accept": accept})
            assert open_metrics.headers["content-type"].startswith("application/openmetrics")
            assert open_metrics.text.rstrip().endswith("# EOF")
            assert (await client.get("/")).status_code == 404
            assert (await client.post("/metrics")).status_code == 405
        # A client that connects and stays silent does not stop the next scrape: each
        # connection is its own task (its REQUEST_SECONDS bound is not exercised here).
        silent = await trio.open_tcp_stream("127.0.0.1", port)
        async with silent, httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{port}/metrics")
            assert answer.status_code == 200
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_running_worker_process_serves_its_metrics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url) as driver:
        seen = tmp_path / "seen.txt"
        await app_registry.require("app.record").enqueue_many(
            driver, [{"seen": str(seen)} for _ in range(3)]
        )
        async with worker_processes(
            "tests.apps.sqlite_app:registry", tmp_path, url, 1, "--metrics-port", "0"
        ) as [worker]:
            await started([worker])

            async def serving() -> bool:
                return "jobs.metrics.serving" in worker.output()

            await until("the worker to log jobs.metrics.serving", 20, serving)
            logged = re.search(
                r"jobs\.metrics\.serving host=127\.0\.0\.1 port=(\d+)", worker.output()
            )
            assert logged is not None, worker.output()
            scrape_url = f"http://127.0.0.1:{logged.group(1)}/metrics"
            scraped = ""

            async def counted_all() -> bool:
                nonlocal scraped
                async with httpx.AsyncClient() as client:
                    scraped = (await client.get(scrape_url)).text
                return (
                    'jobs_trio_jobs_total{job="app.record",outcome="ok",queue="bulk"} 3.0'
                    in scraped
                )

            await until("the worker's /metrics to count 3 completed jobs", 30, counted_all)
            assert "jobs_trio_run_seconds_bucket" in scraped
            worker.signal(signal.SIGTERM)
            assert await worker.exit_code(within=30) == 0
