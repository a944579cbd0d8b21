# The relay as a service: batches, exactly-once across a relay that died mid-pass and relays
# running side by side, and the lifecycle (accept stops polling at once; close waits out the
# pass in flight within the budget). Memory drivers on Trio's mock clock: no sleeps.
from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

import jobs_trio
from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.metrics import Metrics
from jobs_trio.records import Enqueued, NewJob
from jobs_trio.testing.conformance.helpers import new_job


def drivers() -> tuple[MemoryDriver, MemoryDriver]:
    return MemoryDriver(clock=trio.current_time), MemoryDriver(clock=trio.current_time)


def relay_of(app: MemoryDriver, store: jobs_trio.Driver, **kw: object) -> jobs_trio.Relay:
    kw.setdefault("metrics", Metrics(CollectorRegistry()))
    return jobs_trio.Relay(jobs_trio.Outbox(app), store, **kw)  # type: ignore[arg-type]


async def test_moves_every_row_in_batches_and_logs_each_pass(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    app, store = drivers()
    await app.outbox_write([new_job(payload={"n": n}) for n in range(25)])
    metrics = Metrics(CollectorRegistry())
    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with jobs_trio.open_relay(app, store, batch=10, metrics=metrics) as relay:
        await trio.sleep(0.5)  # mock time: the three passes run back to back, no poll needed
        assert relay.moved == 25
    assert len(await store.list_jobs(limit=100)) == 25
    assert (await app.outbox_stats()).pending == 0
    moved = [r for r in caplog.records if getattr(r, "event", "") == "jobs.relay.moved"]
    assert [r.fields["rows"] for r in moved] == [10, 10, 5]  # type: ignore[attr-defined]
    assert metrics.outbox_pending._value.get() == 0


class Killed(BaseException):
    """The process died: nothing after this point of the pass ran."""


class DiesAfterWriting:
    """A job store whose relay is killed right after its jobs were written: the delete of the
    outbox rows never happens."""

    def __init__(self, store: MemoryDriver) -> None:
        self.store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def enqueue_once(self, jobs: Sequence[NewJob]) -> Sequence[Enqueued]:
        await self.store.enqueue_once(jobs)
        raise Killed


async def test_a_relay_killed_between_writing_and_deleting_duplicates_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, store = drivers()
    rows = [new_job(payload={"n": n}, key=f"k{n}" if n % 2 else None) for n in range(6)]
    await app.outbox_write(rows)
    doomed = relay_of(app, DiesAfterWriting(store), lease=30.0)  # type: ignore[arg-type]
    with pytest.raises(Killed):
        await doomed._one_pass()
    assert (await app.outbox_stats()).pending == 6  # not deleted
    survivor = relay_of(app, store, lease=30.0)
    assert await survivor._one_pass() == 0  # the dead relay's lease still holds the rows
    await trio.sleep(30.0)
    assert await survivor._one_pass() == 6
    jobs = await store.list_jobs(limit=100)
    assert sorted(j.id for j in jobs) == sorted(r.job_id for r in rows)
    assert (await app.outbox_stats()).pending == 0


async def test_relays_side_by_side_store_each_job_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, store = drivers()
    rows = [new_job(payload={"n": n}) for n in range(200)]
    async with trio.open_nursery() as nursery:
        relays = [relay_of(app, store, batch=7, poll_interval=0.01) for _ in range(3)]
        for relay in relays:
            await nursery.start(relay.run)
        for start in range(0, 200, 20):
            await app.outbox_write(rows[start : start + 20])
            await trio.sleep(0.005)
        await trio.sleep(1.0)
        for relay in relays:
            await relay.stop()
    assert sum(r.moved for r in relays) == 200
    assert all(r.moved for r in relays)  # each took part
    assert len(await store.list_jobs(limit=1000)) == 200


class SlowStore:
    """A job store whose write takes ``seconds`` (mock time): a pass in flight to wait out."""

    def __init__(self, store: MemoryDriver, seconds: float) -> None:
        self.store, self.seconds = store, seconds
        self.writing = trio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def enqueue_once(self, jobs: Sequence[NewJob]) -> Sequence[Enqueued]:
        self.writing.set()
        await trio.sleep(self.seconds)
        return await self.store.enqueue_once(jobs)


async def test_shutdown_stops_polling_at_once_and_waits_out_the_pass_in_flight(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, store = drivers()
    slow = SlowStore(store, seconds=5.0)
    await app.outbox_write([new_job()])
    async with jobs_trio.open_lifecycle(grace=25, signals=()) as lifecycle:
        relay = relay_of(app, slow, lifecycle=lifecycle, poll_interval=1000)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            await slow.writing.wait()
            started = trio.current_time()
            await lifecycle.shutdown("SIGTERM")
            # Waited for the pass (5 s), not for the 1000 s poll, and not cut short.
            assert trio.current_time() - started == pytest.approx(5.0)
            assert relay.state == "stopped" and relay.moved == 1
    assert len(await store.list_jobs()) == 1 and (await app.outbox_stats()).pending == 0


async def test_the_budget_cuts_a_pass_that_outlives_it_and_loses_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, store = drivers()
    slow = SlowStore(store, seconds=100.0)
    await app.outbox_write([new_job()])
    async with jobs_trio.open_lifecycle(grace=3, signals=()) as lifecycle:
        relay = relay_of(app, slow, lifecycle=lifecycle, lease=60.0)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            await slow.writing.wait()
            started = trio.current_time()
            await lifecycle.shutdown("SIGTERM")
            assert trio.current_time() - started == pytest.approx(3.0)
            assert relay.state == "stopped" and relay.moved == 0
    # The row is still in the outbox for the next relay, once the cut relay's lease lapses.
    assert (await app.outbox_stats()).pending == 1
    await trio.sleep(60.0)
    assert await relay_of(app, store)._one_pass() == 1
    assert len(await store.list_jobs()) == 1


async def test_accept_ends_the_wait_between_passes_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app, store = drivers()
    async with jobs_trio.open_lifecycle(grace=25, signals=()) as lifecycle:
        relay = relay_of(app, store, lifecycle=lifecycle, poll_interval=1000)
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            await trio.testing.wait_all_tasks_blocked()  # idle, in its 1000 s wait
            started = trio.current_time()
            await lifecycle.shutdown("SIGTERM")
            assert trio.current_time() == started
            assert relay.state == "stopped"


async def test_open_relay_stops_on_sigterm_by_default(caplog: pytest.LogCaptureFixture) -> None:
    from tests.test_lifecycle import _OwnSigterm

    caplog.set_level(logging.INFO, logger="jobs_trio")
    app, store = drivers()
    with _OwnSigterm() as unhandled, trio.fail_after(10):
        async with jobs_trio.open_relay(app, store, poll_interval=3600) as relay:
            await app.outbox_write([new_job(payload={"n": 1})])
            os.kill(os.getpid(), signal.SIGTERM)
            await trio.sleep_forever()  # the shutdown ends the block
    assert unhandled.received == 0
    assert "jobs.relay.lifecycle-opened" in caplog.text
    assert relay._lifecycle is not None and relay._lifecycle.reason == "SIGTERM"
