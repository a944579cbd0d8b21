# /metrics scraped from a real `jobs-trio worker` process over a database of 10,000 queues
# (issue 36): every name prefixed, no `_created` series, every state of the worker's queue
# present at 0, its slots and waits exported, no outbox gauges, and the queue label capped
# (before: 1.4 MB and 30,001 series for the depth gauges alone).
from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs_trio._core.metrics import MAX_QUEUE_LABELS, OTHER_QUEUES
from jobs_trio._core.records import JobState, NewJob, new_job_id
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.ops_app import registry
from tests.helpers.process_helpers import until, worker_processes

pytestmark = pytest.mark.slow

QUEUES = 10_000


async def test_a_worker_over_10000_queues_exports_bounded_conventional_metrics(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url) as driver:
        # One job in each of 10,000 queues no worker here claims from (another fleet's work).
        await driver.enqueue(
            [NewJob(new_job_id(), "elsewhere.job", f"q{n:05}", "null", 3) for n in range(QUEUES)]
        )
        await registry.require("ops.ok").enqueue_many(driver, [{"n": n} for n in range(5)])
        async with worker_processes(
            "tests.apps.ops_app", tmp_path, url, 1, "--metrics-port", "0", "--log-format", "json"
        ) as [worker]:

            async def serving() -> bool:
                return "jobs.metrics.serving" in worker.output()

            await until("the worker to serve /metrics", 30, serving)
            [line] = [ln for ln in worker.output().splitlines() if "jobs.metrics.serving" in ln]
            port = json.loads(line)["fields"]["port"]
            body = ""

            async def observed() -> bool:
                nonlocal body
                async with httpx.AsyncClient() as client:
                    body = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                # The five jobs ran, and the fleet's observation of the queues is in.
                return (
                    'jobs_trio_jobs_total{job="ops.ok",outcome="ok",queue="ops"} 5.0' in body
                    and f'queue="{OTHER_QUEUES}"' in body
                )

            await until("the worker's /metrics to show its runs and the queues", 30, observed)
            worker.signal(signal.SIGTERM)
            assert await worker.exit_code(within=30) == 0, worker.output()

    families = list(text_string_to_metric_families(body))
    samples = [sample for family in families for sample in family.samples]
    # prometheus-client's own collectors (process_*, python_*) are standard; every other is ours.
    names = {s.name for s in samples if not s.name.startswith(("process_", "python_"))}
    assert all(name.startswith("jobs_trio_") for name in names), sorted(names)
    assert not [name for name in names if name.endswith("_created")]
    assert not [name for name in names if "outbox" in name]  # this worker runs no relay

    def of(name: str) -> list[dict[str, str]]:
        return [sample.labels for sample in samples if sample.name == name]

    depth = {
        (labels["queue"], labels["state"]): sample.value
        for sample in samples
        if sample.name == "jobs_trio_queue_depth"
        for labels in [sample.labels]
    }
    # Bounded: the worker's own queue, then others by name up to the cap, the rest summed.
    queues = {queue for queue, _ in depth}
    assert len(queues) == MAX_QUEUE_LABELS + 1
    assert "ops" in queues and OTHER_QUEUES in queues and "q00000" in queues
    others = [n for (queue, state), n in depth.items() if queue != "ops" and state == "ready"]
    assert sum(others) == QUEUES  # summed into (other), not dropped
    # Every state of a labelled queue is present, at 0 where it holds no job. (The fleet's
    # observation, taken as the worker started, may predate the five runs.)
    for state in JobState:
        assert ("ops", state.value) in depth
    assert sum(n for (queue, _), n in depth.items() if queue == "ops") == 5
    assert depth[("ops", "dead")] == 0
    assert len(samples) < 2_000 and len(body) < 200_000, (len(samples), len(body))
    # The worker's slots (concurrency 10, nothing running by now) and the waits it measured.
    assert {"queue": "ops"} in of("jobs_trio_free_slots")
    assert {"queue": "ops"} in of("jobs_trio_running")
    [waits] = [s.value for s in samples if s.name == "jobs_trio_wait_seconds_count"]
    assert waits == 5
