# The relay as a service: batches, exactly-once across a relay that died at any step of its pass
# (also once the job finished and was pruned, or a held key was freed), relays side by side, the
# sweep of decisions left behind, in place when one database holds both, and the lifecycle
# (accept stops polling at once; close waits out the pass in flight within the budget). Memory
# drivers on Trio's mock clock: no sleeps. Real processes: test_relay_kill_processes.py.
from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

import jobs_trio
from jobs_trio._core.metrics import Metrics
from jobs_trio._core.records import Complete, NewJob, PruneTurn
from jobs_trio.drivers.memory import MemoryDriver
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

    async def relay_enqueue(self, jobs: Sequence[NewJob], **kw: Any) -> Sequence[object]:
        await self.store.relay_enqueue(jobs, **kw)
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


class KillsAt:
    """The two databases of a relay that is killed right after one step of its pass: ``claimed``
    (rows taken, nothing written), ``written`` (jobs and decisions stored, rows not deleted),
    ``deleted`` (rows deleted, decisions not forgotten)."""

    def __init__(self, driver: MemoryDriver, step: str) -> None:
        self.driver, self.step = driver, step

    def __getattr__(self, name: str) -> object:
        return getattr(self.driver, name)

    async def _then(self, step: str, answer: object) -> object:
        if step == self.step:
            raise Killed
        return answer

    async def outbox_claim(self, limit: int, **kw: Any) -> object:
        return await self._then("claimed", await self.driver.outbox_claim(limit, **kw))

    async def relay_enqueue(self, jobs: Sequence[NewJob], **kw: Any) -> object:
        return await self._then("written", await self.driver.relay_enqueue(jobs, **kw))

    async def outbox_delete(self, job_ids: Sequence[str], **kw: Any) -> object:
        return await self._then("deleted", await self.driver.outbox_delete(job_ids, **kw))


async def run_out(store: MemoryDriver, queue: str) -> list[str]:
    """Complete every job of ``queue`` that is due; answer their ids."""
    done = []
    while claims := await store.claim([queue], 10, lease=30.0, worker_id="w"):
        await store.settle([Complete(c.lease) for c in claims])
        done += [c.job_id for c in claims]
    return done


@pytest.mark.parametrize("step", ["claimed", "written", "deleted"])
async def test_a_relay_killed_at_any_step_decides_each_row_once_also_after_pruning(
    autojump_clock: trio.testing.MockClock, step: str
) -> None:
    app, store = drivers()
    holder = new_job(queue="held", key="held")
    await store.enqueue([holder])  # a live job holding the key one row asks for
    rows = [new_job(), new_job(key="fresh"), new_job(key="held")]
    await app.outbox_write(rows)
    doomed = jobs_trio.Relay(
        KillsAt(app, step),  # type: ignore[arg-type]
        KillsAt(store, step),  # type: ignore[arg-type]
        lease=30.0,
        metrics=Metrics(CollectorRegistry()),
    )
    with pytest.raises(Killed):
        await doomed._one_pass()
    # Whatever it wrote runs to completion, the holder too (its key is free now), and
    # retention deletes them all before any relay looks at the rows again.
    ran = await run_out(store, "default")
    assert sorted(ran) == ([] if step == "claimed" else sorted([rows[0].job_id, rows[1].job_id]))
    assert await run_out(store, "held") == [holder.job_id]
    await trio.sleep(10.0)
    await store.prune(PruneTurn("p", keep_finished=1.0, keep_dead=1.0))
    assert await store.list_jobs() == []

    await trio.sleep(30.0)  # the dead relay's lease lapses
    survivor = relay_of(app, store, lease=30.0)
    await survivor._one_pass()
    ran += await run_out(store, "default")
    # Each row decided once, when it was first delivered: a row the dead relay decided keeps
    # its decision (the held key's row stays a no-op though its holder is gone), whatever
    # retention did meanwhile; one it never wrote is decided now, against the store as it is.
    decided_late = [rows[2].job_id] if step == "claimed" else []
    assert sorted(ran) == sorted([rows[0].job_id, rows[1].job_id, *decided_late])
    assert (await app.outbox_stats()).pending == 0
    # No decision outlives its row: forgotten by the pass, or by the sweep once a lease old.
    source = await app.outbox_source()
    await trio.sleep(31.0)
    await survivor._one_pass()
    assert await store.relay_decisions(source, before=math.inf, limit=10) == []


async def test_one_database_moves_in_place_and_records_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    both = MemoryDriver(clock=trio.current_time)
    holder = new_job(key="k")
    await both.enqueue([holder])
    rows = [new_job(), new_job(key="k")]
    await both.outbox_write(rows)
    relay = relay_of(both, both)
    assert await relay._one_pass() == 2
    fields = {getattr(r, "event", ""): getattr(r, "fields", {}) for r in caplog.records}
    assert fields["jobs.relay.mode"]["mode"] == "in-place"
    assert (fields["jobs.relay.moved"]["created"], fields["jobs.relay.moved"]["key_held"]) == (1, 1)
    assert sorted(r.id for r in await both.list_jobs()) == sorted([holder.job_id, rows[0].job_id])
    assert (await both.outbox_stats()).pending == 0
    source = await both.outbox_source()
    assert await both.relay_decisions(source, before=math.inf, limit=10) == []


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

    async def relay_enqueue(self, jobs: Sequence[NewJob], **kw: Any) -> Sequence[object]:
        self.writing.set()
        await trio.sleep(self.seconds)
        return await self.store.relay_enqueue(jobs, **kw)


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
            assert relay.state is jobs_trio.RelayState.STOPPED and relay.moved == 1
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
    from tests.run.test_lifecycle import _OwnSigterm

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


class PausesAfterTaking:
    """An outbox whose relay is paused (a SIGSTOP, a VM freeze) right after it took its rows,
    until ``resume`` is set: the pause outlives the relay's lease."""

    def __init__(self, driver: MemoryDriver) -> None:
        self.driver = driver
        self.took = trio.Event()
        self.resume = trio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self.driver, name)

    async def outbox_claim(self, limit: int, **kw: Any) -> object:
        batch = await self.driver.outbox_claim(limit, **kw)
        self.took.set()
        await self.resume.wait()
        return batch


async def test_a_relay_paused_past_its_lease_is_fenced_and_every_row_runs_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    app, store = drivers()
    rows = [new_job(payload={"n": n}) for n in range(30)]
    await app.outbox_write(rows)
    outbox = PausesAfterTaking(app)
    paused = jobs_trio.Relay(
        outbox,  # type: ignore[arg-type]
        store,
        lease=3.0,
        relay_id="paused",
        metrics=Metrics(CollectorRegistry()),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(paused._one_pass)
        await outbox.took.wait()
        await trio.sleep(7.0)  # past its 3 s lease: another relay takes the rows over
        taker = relay_of(app, store, lease=3.0, relay_id="taker")
        assert await taker._one_pass() == 30
        ran = await run_out(store, "default")
        await trio.sleep(10.0)
        await store.prune(PruneTurn("p", keep_finished=1.0, keep_dead=1.0))
        assert await store.list_jobs() == []  # retention took them: no id answers the waker
        outbox.resume.set()
    ran += await run_out(store, "default")
    assert sorted(ran) == sorted(r.job_id for r in rows)  # 30 runs, each row once
    assert (paused.moved, paused.fenced, taker.moved) == (0, 30, 30)
    [fenced] = [r for r in caplog.records if getattr(r, "event", "") == "jobs.relay.fenced"]
    assert fenced.fields["relay"] == "paused" and fenced.fields["rows"] == 30  # type: ignore[attr-defined]
    assert (await app.outbox_stats()).pending == 0
