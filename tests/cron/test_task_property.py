# Invariant 11 as a property: random fleets of schedulers (how many, when each starts and stops,
# how far each one's clock is off) on one store. Every scheduled time fires at most once; with
# true clocks and the default policy, every time a worker was up for fires, and so does the
# latest time missed before each start.
from __future__ import annotations

import datetime as dt
import json
from typing import Any, cast

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from jobs_trio import Registry
from jobs_trio._core.metrics import Metrics
from jobs_trio._cron.scheduler import TaskScheduler
from jobs_trio.driver import Driver
from jobs_trio.drivers.memory import MemoryDriver

EPOCH = dt.datetime(2025, 6, 2, tzinfo=dt.UTC).timestamp()
EVERY = 5  # seconds


@attrs.frozen
class Shift:
    start: float  # mock seconds
    length: float
    skew: float  # this worker's clock minus the true time


class SkewedClock:
    """One worker's view of the shared store: the same data, its own (wrong) clock."""

    def __init__(self, inner: MemoryDriver, skew: float) -> None:
        self._inner = inner
        self._skew = skew

    def now(self) -> float:
        return self._inner.now() + self._skew

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def run_fleet(shifts: list[Shift], missed: str) -> list[float]:
    """Run every shift's scheduler on one memory store; answer the fired scheduled times
    (seconds since EPOCH), in the order they were enqueued."""
    registry = Registry()
    task = registry.task("tick", every=EVERY, missed=missed, catch_up=3)(lambda c, p: None)

    async def main() -> list[float]:
        store = MemoryDriver(clock=lambda: EPOCH + trio.current_time())

        async def shift(one: Shift) -> None:
            await trio.sleep_until(one.start)
            driver = cast(Driver, SkewedClock(store, one.skew))
            scheduler = TaskScheduler(driver, [task], metrics=Metrics(CollectorRegistry()))
            with trio.move_on_at(one.start + one.length):
                await scheduler.run()

        async with trio.open_nursery() as nursery:
            for one in shifts:
                nursery.start_soon(shift, one)
        jobs = sorted(await store.list_jobs(limit=100_000), key=lambda j: (j.created_at, j.id))
        return [json.loads(j.payload)["scheduled_ts"] - EPOCH for j in jobs]

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


times = st.floats(min_value=0, max_value=120).map(lambda t: round(t, 1))
shifts = st.builds(Shift, start=times, length=times, skew=st.just(0.0))
skewed = st.builds(
    Shift, start=times, length=times, skew=st.floats(-20, 20).map(lambda t: round(t, 1))
)


@settings(max_examples=60, deadline=None)
@given(st.lists(skewed, min_size=1, max_size=5), st.sampled_from(["skip", "latest", "all"]))
def test_no_scheduled_time_fires_twice_whatever_the_fleet_and_its_clocks(
    fleet: list[Shift], missed: str
) -> None:
    fired = run_fleet(fleet, missed)
    assert len(fired) == len(set(fired)), fired
    assert all(t % EVERY == 0 for t in fired)


@settings(max_examples=60, deadline=None)
@given(st.lists(shifts, min_size=1, max_size=5))
def test_with_true_clocks_the_default_policy_misses_nothing_it_should_fire(
    fleet: list[Shift],
) -> None:
    fired = run_fleet(fleet, "latest")
    assert len(fired) == len(set(fired)), fired
    ran = [one for one in fleet if one.length > 0]  # a zero-length shift never looks
    if not ran:
        assert fired == []
        return
    first = min(one.start for one in ran)
    expected: set[float] = set()
    for one in ran:
        # Every time strictly inside a shift (a worker was up, looking)...
        k = one.start // EVERY + 1
        while k * EVERY < one.start + one.length:
            expected.add(k * EVERY)
            k += 1
        # ...and the latest time at or before each start, once the task existed.
        latest = one.start // EVERY * EVERY
        if latest > first:
            expected.add(latest)
    assert expected <= set(fired), sorted(expected - set(fired))
    # Nothing from before the task first existed.
    assert all(t > first for t in fired)
