# No lost wake-up, through a worker (issue 45): every suspend the worker writes races a send of
# its job's event, fired at that very moment on another connection (the send's statement in
# flight with the settle's), or made in a transaction the application holds open past the
# settle. Each job must wake without waiting for its event_poll (an hour here: a wake-up lost is
# a test that times out), on every driver. The full-size count and its timings are
# bench/event_race.py's (3,000 jobs, a sender process); PostgreSQL lost some of these before.
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio._core.records import Settlement, Suspend
from jobs_trio.driver import Driver
from tests.conftest import require_postgres

EVENT = "race.go"
POLL = 3600.0


class SendsAtEachSuspend:
    """The worker's driver, with a send of each suspended job's event started as its suspend
    is written (``hold``: in a transaction held open that long after the send)."""

    def __init__(self, driver: Driver, nursery: trio.Nursery, hold: float) -> None:
        self.driver, self.nursery, self.hold = driver, nursery, hold
        self.sent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)

    async def settle(self, settlements: Sequence[Settlement]) -> Any:
        self._race(settlements)
        return await self.driver.settle(settlements)

    async def settle_and_claim(self, settlements: Sequence[Settlement], *a: Any, **kw: Any) -> Any:
        self._race(settlements)
        return await self.driver.settle_and_claim(settlements, *a, **kw)  # type: ignore[attr-defined]

    def _race(self, settlements: Sequence[Settlement]) -> None:
        for s in settlements:
            if isinstance(s, Suspend) and s.event == EVENT:
                self.nursery.start_soon(self._send, s.match)

    async def _send(self, key: str) -> None:
        if self.hold:
            async with jobs_trio.transaction(self.driver) as tx:
                await self.driver.send_event(EVENT, "{}", key=key, connection=tx)
                await trio.sleep(self.hold)
        else:
            await self.driver.send_event(EVENT, "{}", key=key)
        self.sent += 1


@contextlib.asynccontextmanager
async def a_driver(kind: str, tmp_path: Path) -> AsyncIterator[Driver]:
    if kind == "memory":
        url, options = "memory://", {}
    elif kind == "sqlite":
        url, options = f"sqlite:///{tmp_path / 'jobs.db'}", {}
    else:
        url = require_postgres()
        options = {
            "schema": f"jt_race_{id(tmp_path) % 10**9}",
            "migrate": True,
            "drop_schema_on_close": True,
        }
    async with jobs_trio.open_driver(url, **options) as driver:
        yield driver


@pytest.mark.parametrize(
    ("kind", "jobs", "hold"),
    [
        ("memory", 200, 0.0),
        ("sqlite", 100, 0.0),
        ("sqlite", 40, 0.01),
        pytest.param("postgres", 150, 0.0, marks=pytest.mark.postgres),
        pytest.param("postgres", 100, 0.05, marks=pytest.mark.postgres),
    ],
)
async def test_a_send_racing_each_suspend_wakes_every_job_without_its_poll(
    kind: str, jobs: int, hold: float, tmp_path: Path
) -> None:
    woke: set[str] = set()
    all_woke = trio.Event()
    registry = jobs_trio.Registry()

    @registry.job("race.wait", queue="race", event_poll=POLL)
    async def wait(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
        await ctx.step.wait_for_event("go", EVENT, match=payload["key"], include_earlier=True)
        woke.add(payload["key"])
        if len(woke) == jobs:
            all_woke.set()

    async with a_driver(kind, tmp_path) as driver, trio.open_nursery() as sends:
        racing = SendsAtEachSuspend(driver, sends, hold)
        await wait.enqueue_many(driver, [{"key": f"k{n}"} for n in range(jobs)])
        async with jobs_trio.open_worker(
            racing,  # type: ignore[arg-type]
            registry,
            queues=["race"],
            concurrency=20,
            drain_on_shutdown=False,
        ):
            # Far below the poll, far above a loaded machine's run of these jobs (1-3 s).
            with trio.move_on_after(60):
                await all_woke.wait()
        assert len(woke) == jobs, f"{jobs - len(woke)} of {jobs} jobs missed their event"
        assert racing.sent == jobs  # one send a job: each raced its job's one suspend
