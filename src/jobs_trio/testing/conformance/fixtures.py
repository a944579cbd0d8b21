# The suite's fixtures, built on the one a driver's tests provide: `driver_factory`.
# Apart from the tests so that a third party's test module imports them with the tests.
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

# Given a clock, open a fresh, empty driver that reads its time from that clock only (the suite
# moves time by hand: a lease's end, a delay, a backoff); close it on the way out. Called once
# per test, and once per example by the property tests: each call must give a new store.
DriverFactory = Callable[[Callable[[], float]], AbstractAsyncContextManager[Driver]]


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def driver(driver_factory: DriverFactory, manual_clock: ManualClock) -> AsyncIterator[Driver]:
    """The driver under test, fresh, on the test's manual clock."""
    async with driver_factory(manual_clock) as opened:
        yield opened
