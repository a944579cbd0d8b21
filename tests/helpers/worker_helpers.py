# Builders for worker tests: the public kit's (jobs_trio.testing) under the names these tests
# use, fresh metrics, and the reads the tests repeat.
from __future__ import annotations

from prometheus_client import CollectorRegistry

from jobs_trio._core.metrics import Metrics
from jobs_trio._core.records import JobRecord
from jobs_trio.driver import Driver
from jobs_trio.testing import memory_driver as trio_driver
from jobs_trio.testing import new_worker as worker

__all__ = ["counted", "fresh_metrics", "record", "trio_driver", "worker"]


def fresh_metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def counted(metrics: Metrics, outcome: str, job: str, queue: str = "default") -> float:
    labels = {"queue": queue, "job": job, "outcome": outcome}
    return metrics.registry.get_sample_value("jobs_trio_jobs_total", labels) or 0.0


async def record(driver: Driver, job_id: str) -> JobRecord:
    found = await driver.get(job_id)
    assert found is not None
    return found
