# The fleet's workers as they announce themselves (issue 36): an announcement replaces the
# worker's previous one, a stopped worker is forgotten at once, a crashed one an hour after its
# last announcement; every driver keeps the same fields.
from __future__ import annotations

from typing import Any

import attrs

from jobs_trio._core.records import WorkerPresence
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import FORGET_WORKERS_AFTER
from jobs_trio.testing._clock import ManualClock


def presence(worker_id: str, now: float, **changes: Any) -> WorkerPresence:
    seen = WorkerPresence(
        worker_id=worker_id,
        host="box-1",
        pid=4242,
        queues=("mail", "reports"),
        concurrency=20,
        running=3,
        state="running",
        version="0.2.0",
        started_at=now - 100,
        seen_at=now,
        every=15.0,
        jobs=(("mail.send", "mail", 5), ("report.build", "reports", 3)),
    )
    return attrs.evolve(seen, **changes)


async def test_a_worker_is_listed_as_it_last_announced_itself(
    driver: Driver, manual_clock: ManualClock
) -> None:
    now = manual_clock.now
    await driver.worker_seen(presence("w-b", now))
    await driver.worker_seen(presence("w-a", now, queues=("default",), running=0))
    assert await driver.workers() == [
        presence("w-a", now, queues=("default",), running=0),
        presence("w-b", now),
    ]
    manual_clock.advance(15)
    later = presence("w-b", manual_clock.now, running=7, state="draining", jobs=())
    await driver.worker_seen(later)
    assert (await driver.workers())[1] == later


async def test_a_stopped_worker_is_forgotten_and_a_silent_one_after_an_hour(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await driver.worker_seen(presence("w-stops", manual_clock.now))
    await driver.worker_seen(presence("w-crashes", manual_clock.now))
    await driver.worker_gone("w-stops")
    await driver.worker_gone("w-never-seen")  # nothing to forget: no error
    assert [w.worker_id for w in await driver.workers()] == ["w-crashes"]
    manual_clock.advance(FORGET_WORKERS_AFTER + 1)
    [crashed] = await driver.workers()
    assert not crashed.live(manual_clock.now)  # still recorded, no longer live
    await driver.worker_seen(presence("w-new", manual_clock.now))
    assert [w.worker_id for w in await driver.workers()] == ["w-new"]
