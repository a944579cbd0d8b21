# Fleet limits seen from a worker (issue 15): a slot taken over while its body runs cancels the
# body with the slot's own reason and hands the job back as interrupted (docs/limits.md); slot
# waits neither spin the claim loop nor exceed the limit; the waiting are exported as a gauge.
from __future__ import annotations

from typing import Any

import trio
import trio.testing

from jobs_trio import FleetLimit, JobContext, Outbox, RateLimit, Registry, Relay
from jobs_trio._core.records import JobState
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import counted, fresh_metrics, record, trio_driver, worker
from tests.ops.test_metrics import gauge


async def test_a_slot_taken_over_cancels_the_body_slot_lost_and_hands_the_job_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = Registry()
    started = trio.Event()
    heard: list[str] = []

    @registry.job("exports.run", fleet_limit=FleetLimit(1, key=lambda p: p["account"]))
    async def export(ctx: JobContext, payload: dict[str, Any]) -> None:
        if payload["first"]:
            started.set()
            try:
                await trio.sleep_forever()
            finally:
                heard.append(ctx.cancel_reason.code if ctx.cancel_reason else "none")

    # The driver's clock can run ahead of the worker's: to the driver, every lease it holds has
    # then lapsed, as it would after renewals stalled past the lease.
    skew = [0.0]
    driver = MemoryDriver(clock=lambda: trio.current_time() + skew[0])
    first = await export.enqueue(driver, {"account": "acme", "first": True})
    metrics = fresh_metrics()
    # Concurrency 1: the worker itself claims nothing more while the first body runs.
    w = worker(driver, registry, concurrency=1, lease=10, renew_interval=3, metrics=metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        skew[0] = 11.0
        second = await export.enqueue(driver, {"account": "acme", "first": False}, priority=-1)
        # Another worker's claim takes the lapsed slot over (the first job's own lease is still
        # its run's: nobody claimed that job). It takes no lapsed job (rescue=False, as a
        # worker back from an outage claims): else it would hand the first back orphaned.
        [over] = await driver.claim(["default"], 1, lease=10, worker_id="other", rescue=False)
        assert over.job_id == second
        with trio.fail_after(10):
            while not heard:
                await trio.sleep(0.5)
        await w.stop()
    assert heard == ["X_SLOT_LOST"]
    handed_back = await record(driver, first)
    # The drain's row of the table: ready at once, the attempt handed back, the reason kept.
    assert (handed_back.state, handed_back.attempts) == (JobState.READY, 0)
    assert handed_back.last_error is not None and "X_SLOT_LOST" in handed_back.last_error
    assert w.stats().outcomes["interrupted"] == 1
    assert counted(metrics, "failed", "exports.run") == 0


async def test_a_worker_never_runs_more_than_the_slots_and_waits_without_spinning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = Registry()
    running = 0
    peak = 0
    claims = 0

    @registry.job("slow", fleet_limit=FleetLimit(2))
    async def slow(ctx: JobContext, payload: None) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(5)
        running -= 1

    driver = trio_driver()
    claim = driver.claim

    async def counting_claim(*args: Any, **kw: Any) -> Any:
        nonlocal claims
        claims += 1
        return await claim(*args, **kw)

    driver.claim = counting_claim  # type: ignore[method-assign]
    ids = await slow.enqueue_many(driver, [None] * 6)
    w = worker(driver, registry, concurrency=10)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            while [r for r in await driver.list_jobs() if r.state is not JobState.COMPLETED]:
                await trio.sleep(1)
            await w.stop()
    assert peak == 2
    # Three rounds of two, each started by the settle that freed the slots (not by a poll):
    # 15 s of mock time, and a handful of claims rather than a spin.
    assert trio.current_time() <= 16
    assert claims < 20
    assert [r.attempts for r in await driver.list_jobs()] == [1] * len(ids)


async def test_the_jobs_waiting_on_a_limit_are_a_gauge(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry = Registry()

    @registry.job("capped", queue="mail", fleet_limit=FleetLimit(1))
    async def capped(ctx: JobContext, payload: None) -> None: ...

    @registry.job("paced", queue="mail", rate_limit=RateLimit(1, per=60))
    async def paced(ctx: JobContext, payload: None) -> None: ...

    driver = trio_driver()
    await capped.enqueue_many(driver, [None] * 3)
    await paced.enqueue_many(driver, [None] * 2)
    assert len(await driver.claim(["mail"], 10, lease=30, worker_id="x")) == 2
    metrics = fresh_metrics()
    w = worker(driver, registry, queues=["other"], metrics=metrics, stats_interval=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        await w.stop()
    assert gauge(metrics, "limit_waiting", queue="mail", job="capped", limit="slot") == 2
    assert gauge(metrics, "limit_waiting", queue="mail", job="paced", limit="rate") == 1


async def test_a_limited_job_enqueued_through_the_outbox_is_limited_once_relayed() -> None:
    registry = Registry()

    @registry.job("capped", fleet_limit=FleetLimit(1, key=lambda p: p["account"]))
    async def capped(ctx: JobContext, payload: dict[str, str]) -> None: ...

    app_db, store = trio_driver(), trio_driver()
    ids = [await capped.enqueue(Outbox(app_db), {"account": "acme"}) for _ in range(2)]
    assert await Relay(Outbox(app_db), store)._one_pass() == 2
    # As two direct enqueues would be: one slot for the account, so one claim at a time.
    [claim] = await store.claim(["default"], 10, lease=30, worker_id="w")
    [other] = [i for i in ids if i != claim.job_id]
    waiting = await store.get(other)
    assert waiting is not None and (waiting.slot_key, waiting.slots) == ("capped:acme", 1)
