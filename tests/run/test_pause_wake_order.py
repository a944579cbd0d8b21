# A process paused past its leases (SIGSTOP, a stalled VM) wakes with the lease watchdog's timer
# and its bodies' own timers due in one pass of the loop: every lapsed run is stopped before any
# of those bodies takes a step, for another worker may be running the same jobs by then.
from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from jobs_trio import JobContext, Registry, open_worker
from jobs_trio.drivers.memory import MemoryDriver


async def test_no_body_takes_a_step_past_its_lapsed_lease_after_a_pause(
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """One body's timer comes due before the watchdog's wake and one after it: in either order
    Trio runs that pass's tasks, one of them ran before the watchdog (its side effect made
    while another worker held the job: a reviewer's SIGSTOP probe saw 8 of 8)."""
    registry = Registry()
    stepped: list[float] = []
    asleep = 0
    both = trio.Event()

    @registry.job("nap")
    async def nap(ctx: JobContext, payload: Any) -> None:
        nonlocal asleep
        asleep += 1
        if asleep == 2:
            both.set()
        await trio.sleep(payload["s"])
        stepped.append(payload["s"])  # the side effect a body makes past its wait

    driver = MemoryDriver(clock=trio.current_time)
    # A lease of 2 s: renewals every 0.67 s, a run stopped 0.5 s before its lease lapses.
    await nap.enqueue_many(driver, [{"s": 0.01}, {"s": 5.0}])
    async with open_worker(
        driver,
        registry,
        lease=2.0,
        drain_on_shutdown=False,
        stats_interval=None,
        claim_ahead=None,
        schedule_tasks=False,
    ):
        await both.wait()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(10.0)  # the process was paused 10 s, its leases long lapsed
        await trio.testing.wait_all_tasks_blocked()
        assert stepped == []
        expired = [r for r in caplog.records if getattr(r, "event", "") == "jobs.lease.expired"]
        assert len(expired) == 2  # both stopped as lapsed (handed back, uncounted)
        mock_clock.autojump_threshold = 0.0  # let the teardown's timers run
