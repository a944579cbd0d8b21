# Small builders the conformance tests share, so every test reads as the behaviour it checks.
from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest
import trio

from jobs_trio._core.records import Claim, NewJob, OutboxBatch, RelayDecision, new_job_id
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock


def new_job(
    name: str = "t.job",
    *,
    queue: str = "default",
    payload: object = None,
    attempts: int = 3,
    priority: int = 0,
    delay: float = 0.0,
    key: str | None = None,
) -> NewJob:
    return NewJob(
        job_id=new_job_id(),
        name=name,
        queue=queue,
        payload=json.dumps(payload if payload is not None else {}),
        max_attempts=attempts,
        priority=priority,
        delay=delay,
        key=key,
    )


def needs_claims_alone(driver: Driver) -> None:
    """Skip a test of the orphan rule (a lapse hands the job back uncounted, rules.orphaning)
    on a driver that does not declare it: such a driver still counts a lapsed attempt."""
    if not driver.capabilities.claims_alone:
        pytest.skip("the driver does not declare claims_alone (the orphan rule)")


async def enqueue_one(driver: Driver, **kw: object) -> str:
    [answer] = await driver.enqueue([new_job(**kw)])  # type: ignore[arg-type]
    return answer.job_id


async def take_rows(
    driver: Driver, limit: int = 10, *, lease: float = 30.0, relay_id: str = "r1"
) -> OutboxBatch:
    """A relay's take of outbox rows, as relay.py makes it: a ticket from the job store (here
    the same driver), then the rows under it."""
    ticket = await driver.relay_ticket(await driver.outbox_source(), relay_id=relay_id, lease=lease)
    return await driver.outbox_claim(limit, lease=lease, relay_id=relay_id, ticket=ticket)


async def relay_write(
    driver: Driver, jobs: Sequence[NewJob], *, source: str, relay_id: str = "r1"
) -> Sequence[RelayDecision]:
    """A relay's write of rows it holds under a fresh ticket of its own (no row taken over)."""
    ticket = await driver.relay_ticket(source, relay_id=relay_id, lease=30.0)
    return await driver.relay_enqueue(jobs, source=source, ticket=ticket)


async def claim_one(driver: Driver, queue: str = "default", lease: float = 30.0) -> Claim:
    claims = await driver.claim([queue], 1, lease=lease, worker_id="w1")
    assert len(claims) == 1, claims
    return claims[0]


async def a_claim_taken_over(driver: Driver, clock: ManualClock) -> tuple[str, Claim, Claim]:
    """A job claimed under a 10 s lease that lapsed, then claimed again (by another worker, as
    far as the driver can tell): its id, the stale claim (its token no longer holds the job)
    and the current one."""
    job_id = await enqueue_one(driver)
    stale = await claim_one(driver, lease=10)
    clock.advance(11)
    current = await claim_one(driver, lease=10)
    return job_id, stale, current


@contextlib.asynccontextmanager
async def a_waiting_worker(
    driver: Driver, queues: tuple[str, ...] = ("default",)
) -> AsyncIterator[trio.Event]:
    """A task inside ``driver.wait_for_work(queues, timeout=60)`` and past its look for due work,
    parked on the driver's wake-up, so only a wake-up can end its wait; the block must bring one
    within 20 s. Yields the event the task sets when its wait returns.

    "Past its look" is read from the task itself, whatever the driver (a look may run in a
    thread or on asyncio, where no Trio wait can see it end): the block starts once the task's
    ``wait_for_work`` awaits a Trio ``ParkingLot.park`` or ``Event.wait`` directly, checked after
    each step the task takes. Ordered so, an enqueue in the block is heard as a wake-up, never
    found by the look."""

    async def wait() -> object:
        await driver.wait_for_work(list(queues), timeout=60)
        return None

    async with _parked_in("wait_for_work", wait) as woke:
        yield woke.event


@contextlib.asynccontextmanager
async def a_waiting_watch(driver: Driver, seen: int) -> AsyncIterator[Answer]:
    """``a_waiting_worker`` for ``driver.wait_for_pauses(seen, timeout=60)``: parked past its
    look, so only a wake-up ends it. Yields what the watch answers, once it has."""
    async with _parked_in("wait_for_pauses", lambda: driver.wait_for_pauses(seen, 60)) as woke:
        yield woke


class Answer:
    """What a waiting call answered (``value``), once it has (``event``)."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: object = None


@contextlib.asynccontextmanager
async def _parked_in(method: str, call: Callable[[], Awaitable[object]]) -> AsyncIterator[Answer]:
    answer = Answer()
    parked = trio.Event()

    async def waiter(*, task_status: trio.TaskStatus[trio.lowlevel.Task]) -> None:
        task_status.started(trio.lowlevel.current_task())
        answer.value = await call()
        answer.event.set()

    class Watch(trio.abc.Instrument):
        def after_task_step(self, task: trio.lowlevel.Task) -> None:
            if task is waiting and _parked_on_its_wake_up(task, method):
                parked.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            waiting = await nursery.start(waiter)
            watch = Watch()
            trio.lowlevel.add_instrument(watch)
            try:
                # No checkpoint between this look and the wait: no step of the task is missed.
                if not _parked_on_its_wake_up(waiting, method):
                    await parked.wait()
            finally:
                trio.lowlevel.remove_instrument(watch)
            yield answer
            await answer.event.wait()


# What a driver may name the method its waits park in, for ``a_waiting_worker`` to find them
# parked there (never in their look: a lock's park inside a look is not a wake-up).
WAKE_UP = "_await_wake_up"


def _parked_on_its_wake_up(task: trio.lowlevel.Task, method: str) -> bool:
    """Whether ``task``'s ``method`` call is awaiting a Trio wake-up itself (not its look).
    The wake-up may be awaited by ``_method``, the driver's own body behind a call said once
    for several drivers (drivers/_calls.py), or by a method named ``WAKE_UP`` that a driver's
    waits share (the SQLite driver's parks there between looks at its file's data version)."""
    names = (method, f"_{method}", WAKE_UP)
    awaiting: object = task.coro
    while awaiting is not None:
        code = getattr(awaiting, "cr_code", None)
        if code is not None and code.co_name in names:
            inner = getattr(getattr(awaiting, "cr_await", None), "cr_code", None)
            if inner is not None and inner.co_qualname in ("ParkingLot.park", "Event.wait"):
                return True
        awaiting = getattr(awaiting, "cr_await", None)
    return False
