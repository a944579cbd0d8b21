# Run an application's jobs in a test: a memory driver on Trio's clock, a worker for tests, and
# rounds of claim-and-run until nothing is left to run (on a MockClock, backoffs take no time).
from __future__ import annotations

import collections
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from .._core.errors import ConfigError
from .._core.metrics import Metrics
from .._core.records import WAITING_STATES
from .._jobs.registry import Registry
from .._run.attempt import Outcome
from .._run.worker import Worker
from ..drivers.contract import Driver
from ..drivers.memory import MemoryDriver

# Enough to see every waiting job of a test's queue: run_until_idle looks for the soonest.
_LISTED = 100_000


def memory_driver() -> MemoryDriver:
    """A memory driver whose time is Trio's: run-ats, leases, backoffs and ``step.sleep`` move
    with ``trio.testing.MockClock`` (pytest-trio's ``autojump_clock``), as the worker's waits do.
    (``MemoryDriver()`` alone reads the wall clock, which a mock clock does not move.)"""
    return MemoryDriver(clock=trio.current_time)


def new_worker(driver: Driver, registry: Registry, **options: Any) -> Worker:
    """A ``Worker`` for one test: its own metrics (a second worker in the process does not
    collide on prometheus_client's default registry), no queue gauges, and a long pause after
    a failed claim and between a failed write's retries (``poll_interval=600``: on a mock clock
    a driver that fails does not spin through rounds). The safety poll stays at its default
    (30 s): it is what finds a lease that lapsed unrenewed. ``options`` are ``Worker``'s and
    override these."""
    options.setdefault("metrics", Metrics(CollectorRegistry()))
    options.setdefault("stats_interval", None)
    options.setdefault("poll_interval", 600.0)
    return Worker(driver, registry, **options)


async def run_until_idle(
    worker: Worker, *, wait: bool = True, max_attempts: int | None = None
) -> list[Outcome]:
    """Run rounds of ``worker.tick()`` (claim what is due, run it to its outcome, settle it)
    until nothing is left to run, and answer every attempt's outcome, round after round (within
    a round, in the order the runs ended).

    With ``wait`` (the default), when nothing is due it sleeps on Trio's clock until the soonest
    job of the worker's queues that waits for a time (a delay, a retry's backoff, a
    ``step.sleep``), so on a MockClock retries run to the end at once; a job suspended on an
    event waits for the test to send it. ``wait=False`` stops at the first round that claims
    nothing: no time passes. ``max_attempts``: fail (AssertionError, naming the jobs run most)
    once that many attempts have run and a job is still due; None runs on while jobs come (a
    job that enqueues another without end runs forever, on a mock clock without any time
    passing: ``trio.fail_after`` never fires). Not while the worker runs its own loop."""
    driver = worker.driver
    outcomes: list[Outcome] = []
    while True:
        ran = await worker.tick()
        outcomes += ran
        if ran:
            ended = max_attempts is not None and len(outcomes) >= max_attempts
            if ended and await _soonest_wait(worker) is not None:
                raise _endless(outcomes)
            continue
        due = await _soonest_wait(worker) if wait else None
        if due is None:
            return outcomes
        before = driver.now()
        await trio.sleep(max(0.0, due - before))
        if due > before and driver.now() == before:
            raise ConfigError(
                "run_until_idle waited on Trio's clock, and the driver's clock did not move",
                fix="give the driver Trio's clock: jobs_trio.testing.memory_driver(), "
                "or MemoryDriver(clock=trio.current_time)",
            )


# drain's bound on the attempts it runs: far past what a test enqueues, reached in seconds
# (about 1.3 ms an attempt) by a job that enqueues another without end.
DRAIN_ATTEMPTS = 10_000


async def drain(
    driver: Driver, registry: Registry, *, max_attempts: int | None = DRAIN_ATTEMPTS, **options: Any
) -> list[Outcome]:
    """Run every job of ``registry``'s queues on ``driver`` until none is left to run, jobs
    enqueued by the jobs it runs included, and answer every attempt's outcome: a test's
    ``new_worker(driver, registry, **options)`` run by ``run_until_idle``. On a memory driver
    and a mock clock (pytest-trio's ``autojump_clock``), delays, backoffs and ``step.sleep``
    pass at once; a job waiting for an event ends the rounds until the test sends it. Fails
    (AssertionError) once ``max_attempts`` have run with jobs still due: jobs that enqueue
    jobs without end (None: no bound)."""
    worker = new_worker(driver, registry, **options)
    return await run_until_idle(worker, max_attempts=max_attempts)


def _endless(outcomes: list[Outcome]) -> AssertionError:
    most = collections.Counter(outcome.name for outcome in outcomes).most_common(3)
    return AssertionError(
        f"{len(outcomes):,} attempts ran and jobs are still due (most run: "
        + ", ".join(f"{name} x{count:,}" for name, count in most)
        + "): a job that enqueues another without end, or one that never stops retrying?"
        " Pass max_attempts= for more (None: no bound)"
    )


async def _soonest_wait(worker: Worker) -> float | None:
    """The soonest run-at of a job in the worker's queues that waits only for time to pass (a
    paused queue's jobs wait for its resume: none of them)."""
    soonest: float | None = None
    paused = {pause.queue for pause in await worker.driver.queue_pauses()}
    for queue in worker.queues:
        if queue in paused:
            continue
        for state in WAITING_STATES:
            for job in await worker.driver.list_jobs(state=state, queue=queue, limit=_LISTED):
                if job.wait_event is None and (soonest is None or job.run_at < soonest):
                    soonest = job.run_at
    return soonest
