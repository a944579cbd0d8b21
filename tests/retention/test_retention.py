# Retention as a worker runs it, on Trio's mock clock: finished jobs go after their age, live
# ones stay, two workers share one turn, a stop ends the pruner, bad settings are refused.
from __future__ import annotations

import datetime as dt
import itertools
import logging
from typing import Any

import pytest
import trio

from jobs_trio import Registry
from jobs_trio._core.errors import DriverError, InvalidArgument
from jobs_trio._core.records import JobState, Pruned, PruneTurn
from jobs_trio._retention.pruner import RETRY_AFTER, Retention, prune_all
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import trio_driver, worker

HOUR = 3600.0


def registry() -> Registry:
    reg = Registry()

    @reg.job("t.done", attempts=1)
    async def done(ctx: Any, payload: Any) -> str:
        return "ok"

    @reg.job("t.fails", attempts=1)
    async def fails(ctx: Any, payload: Any) -> None:
        raise ValueError("boom")

    @reg.job("t.later")
    async def later(ctx: Any, payload: Any) -> None:
        return None

    return reg


async def states(driver: MemoryDriver) -> dict[str, str]:
    return {r.name: r.state.value for r in await driver.list_jobs(limit=100)}


class CountingDriver(MemoryDriver):
    """The memory driver, counting the prune batches that ran (held the turn)."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.batches: list[tuple[float, str, Pruned]] = []

    async def prune(self, turn: PruneTurn) -> Pruned:
        pruned = await super().prune(turn)
        if pruned.turn:
            self.batches.append((trio.current_time(), turn.holder, pruned))
        return pruned


async def test_a_worker_deletes_finished_jobs_after_their_age_and_keeps_live_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = trio_driver()
    reg = registry()
    retention = Retention(keep_finished=HOUR, keep_dead=3 * HOUR, every=60.0)
    await reg.require("t.done").enqueue(driver, None)
    await reg.require("t.fails").enqueue(driver, None)
    await reg.require("t.later").enqueue(driver, None, delay=10 * HOUR)
    w = worker(driver, reg, retention=retention)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(60)
        assert w._metrics.jobs_pruned._value.get() == 0
        everything = {"t.done": "completed", "t.fails": "dead", "t.later": "ready"}
        assert await states(driver) == everything
        await trio.sleep(HOUR + 60)  # past keep_finished, and the next turn has come
        assert await states(driver) == {"t.fails": "dead", "t.later": "ready"}
        await trio.sleep(2 * HOUR)
        assert await states(driver) == {"t.later": "ready"}
        assert w._metrics.jobs_pruned._value.get() == 2  # jobs_pruned_total
        await w.stop()


async def test_retention_none_keeps_every_finished_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = trio_driver()
    reg = registry()
    await reg.require("t.done").enqueue(driver, None)
    w = worker(driver, reg, retention=None)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(3 * 24 * HOUR)  # past the default keep_finished (a day)
        assert await states(driver) == {"t.done": "completed"}
        await w.stop()


async def test_two_workers_prune_one_at_a_time_one_turn_per_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = CountingDriver()
    reg = registry()
    retention = Retention(keep_finished=HOUR, every=600.0, batch=2)
    for _ in range(5):
        await reg.require("t.done").enqueue(driver, None)
    workers = [worker(driver, reg, retention=retention, worker_id=f"w{i}") for i in (1, 2)]
    async with trio.open_nursery() as nursery:
        for w in workers:
            await nursery.start(w.run)
        await trio.sleep(HOUR + 700)
        # One turn deleted all five, in batches of at most two, by one holder...
        deleting = [(holder, p.deleted) for _, holder, p in driver.batches if p.deleted]
        assert [n for _, n in deleting] == [2, 2, 1]
        assert len({holder for holder, _ in deleting}) == 1
        # ...and across both workers' ticks, turns ended at least `every` apart.
        ended = [at for at, _, p in driver.batches if not p.more]
        assert len(ended) >= 3
        assert all(b - a >= 600.0 for a, b in itertools.pairwise(ended))
        for w in workers:
            await w.stop()


class StalledDriver(MemoryDriver):
    """A database whose prune batch never answers (a lock held elsewhere, a stalled server)."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.pruning = trio.Event()

    async def prune(self, turn: PruneTurn) -> Pruned:
        self.pruning.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_stop_cancels_a_prune_batch_the_database_never_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The pruner is one of the claim loops' idle waits: a stalled batch is cut at the stop,
    not waited for (the worker's teardown would otherwise spend its whole budget on it)."""
    driver = StalledDriver()
    w = worker(driver, registry(), retention=Retention(every=60.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await driver.pruning.wait()
        start = trio.current_time()
        await w.stop()
    assert trio.current_time() - start < 1.0
    assert w.stats().state == "stopped"


class RefusingDriver(MemoryDriver):
    """Refuses every prune batch for the first two hours, as an unreachable database would."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)

    async def prune(self, turn: PruneTurn) -> Pruned:
        if trio.current_time() < 2 * HOUR:
            raise DriverError("the test database refuses the prune", fix="none")
        return await super().prune(turn)


async def test_a_refused_prune_is_logged_and_tried_again_soon_and_the_worker_runs_on(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    driver = RefusingDriver()
    reg = registry()
    job_id = await reg.require("t.done").enqueue(driver, None)
    w = worker(driver, reg, retention=Retention(keep_finished=HOUR, every=3 * HOUR))
    with caplog.at_level(logging.WARNING, logger="jobs_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.sleep(2 * HOUR - 1)
            assert await states(driver) == {"t.done": "completed"}  # refused so far
            # A refused turn is tried again RETRY_AFTER on, not `every` (3 h) on.
            await trio.sleep(RETRY_AFTER + 1)
            assert await driver.get(job_id) is None
            await w.stop()
    assert any("jobs.prune.failed" in r.getMessage() for r in caplog.records)


async def test_prune_all_answers_none_when_another_pruner_holds_the_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = trio_driver()
    reg = registry()
    for _ in range(3):
        await reg.require("t.done").enqueue(driver, None)
    await worker(driver, reg, retention=None).tick()
    await trio.sleep(2 * HOUR)
    first = await driver.prune(PruneTurn("w1", keep_finished=HOUR, keep_dead=None, limit=1))
    assert first.more  # w1 holds the turn between its batches
    assert await prune_all(driver, Retention(keep_finished=HOUR).turn("cli", every=0)) is None
    assert [r.state for r in await driver.list_jobs()] == [JobState.COMPLETED] * 2


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"keep_finished": -1}, "keep_finished"),
        ({"keep_dead": float("nan")}, "keep_dead"),
        ({"every": float("inf")}, "every"),
        ({"batch": 0}, "batch"),
        ({"batch": True}, "batch"),
    ],
)
def test_bad_retention_settings_are_refused_naming_the_setting(
    options: dict[str, Any], argument: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Retention(**options)
    assert caught.value.argument == argument


def test_retention_takes_timedeltas() -> None:
    retention = Retention(keep_finished=dt.timedelta(hours=2), keep_dead=dt.timedelta(days=1))
    assert (retention.keep_finished, retention.keep_dead) == (7200.0, 86400.0)
