# Builders for worker tests: a memory driver on Trio's clock, a registry, fresh metrics.
from __future__ import annotations

from typing import Any

import trio
from prometheus_client import CollectorRegistry

from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.metrics import Metrics
from jobs_trio.records import JobRecord
from jobs_trio.worker import Worker


def trio_driver() -> MemoryDriver:
    """Leases, delays and timeouts all on Trio's (mock) clock."""
    return MemoryDriver(clock=trio.current_time)


def fresh_metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def counted(metrics: Metrics, outcome: str, job: str, queue: str = "default") -> float:
    value = metrics.jobs_total.labels(queue=queue, job=job, outcome=outcome)._value.get()
    return float(value)


def worker(driver: MemoryDriver, registry: Any, **kw: Any) -> Worker:
    kw.setdefault("metrics", fresh_metrics())
    kw.setdefault("stats_interval", None)
    # The memory driver wakes a waiting worker on every change and at every due time, so the
    # poll is only a fallback; a short one makes mock days cost millions of idle wake-ups.
    kw.setdefault("poll_interval", 600.0)
    return Worker(driver, registry, **kw)


async def record(driver: MemoryDriver, job_id: str) -> JobRecord:
    found = await driver.get(job_id)
    assert found is not None
    return found
