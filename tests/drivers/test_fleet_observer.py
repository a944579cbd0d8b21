# Five idle workers on one store read the whole jobs table once per stats interval between them,
# not once each (issue 20), and every one of them still exports the fleet's observation.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from jobs_trio import Registry
from jobs_trio._core.records import QueueStats
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import worker


class ScanCountingDriver(MemoryDriver):
    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.scans = 0

    async def stats(self) -> Sequence[QueueStats]:
        self.scans += 1
        return await super().stats()


async def test_a_fleet_scans_once_per_interval_and_every_worker_exports_it(
    autojump_clock: Any,
) -> None:
    registry = Registry()

    @registry.job("later")
    async def later(ctx: object, payload: None) -> None:
        return None

    driver = ScanCountingDriver()
    await later.enqueue(driver, delay=3600)
    fleet = [worker(driver, registry, stats_interval=15.0) for _ in range(5)]
    async with trio.open_nursery() as nursery:
        for w in fleet:
            await nursery.start(w.run)
        await trio.sleep(61)  # turns at 0, 15, 30, 45, 60

        assert driver.scans == 5  # one per interval for the fleet, not one per worker
        for w in fleet:
            [observed] = w.stats().queue_depth
            assert observed.queue == "default" and observed.depth == {"ready": 1}
        for w in fleet:
            await w.stop()
