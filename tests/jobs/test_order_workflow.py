# The order workflow example, driven on Trio's mock clock with a sent event: each step runs
# once, a day passes in no time, and the event resumes the job.
from __future__ import annotations

from collections import Counter
from typing import Any

import trio
from examples import order_workflow

import jobs_trio
from jobs_trio._core.records import JobState
from tests.helpers.worker_helpers import record, trio_driver, worker


async def until_state(driver: Any, job_id: str, state: JobState) -> None:
    with trio.fail_after(30 * 24 * 3600):
        while (await record(driver, job_id)).state is not state:
            await trio.sleep(60)


class CountingServices(order_workflow.Services):
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    # Async here (the real one is a sync SDK call, run in a thread): the mock clock does not
    # wait for threads, and the workflow, not the thread hop, is what this test is about.
    async def charge(self, order: str, amount: int) -> dict[str, Any]:  # type: ignore[override]
        self.calls["charge"] += 1
        return super().charge(order, amount)

    async def email(self, order: str, text: str) -> str:
        self.calls[f"email: {text}"] += 1
        return await super().email(order, text)


async def test_charge_sleep_wait_for_shipped_then_email(
    autojump_clock: object, monkeypatch: Any
) -> None:
    fake = CountingServices()
    monkeypatch.setattr(order_workflow, "services", fake)
    driver = trio_driver()
    job_id = await order_workflow.fulfil.enqueue(driver, {"order": "A-1", "amount": 4200})
    w = worker(driver, order_workflow.registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await until_state(driver, job_id, JobState.SUSPENDED)  # cooling off
        await trio.sleep(order_workflow.COOLING_OFF)
        waiting = await record(driver, job_id)
        assert waiting.state is JobState.SUSPENDED and waiting.wait_event == "order.shipped"
        await jobs_trio.send_event(driver, "order.shipped", {"carrier": "dhl"}, key="A-1")
        await until_state(driver, job_id, JobState.COMPLETED)
        await w.stop()
    done = await record(driver, job_id)
    assert done.state is JobState.COMPLETED and done.attempts == 1
    result = done.result
    assert result["shipped"] == {"carrier": "dhl"} and result["charge"]["amount"] == 4200
    assert fake.calls == {"charge": 1, "email: shipped with dhl": 1}


async def test_no_shipment_within_a_week_sends_the_delay_email(
    autojump_clock: object, monkeypatch: Any
) -> None:
    fake = CountingServices()
    monkeypatch.setattr(order_workflow, "services", fake)
    driver = trio_driver()
    job_id = await order_workflow.fulfil.enqueue(driver, {"order": "B-2", "amount": 1})
    # A mock week: at the default safety poll (30 s) the worker looked for work and pauses
    # 46,000 times, 11 s of the suite's CPU. The memory driver wakes it when the job is due.
    w = worker(driver, order_workflow.registry, safety_poll=3600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await jobs_trio.send_event(driver, "order.shipped", {"carrier": "ups"}, key="other")
        await until_state(driver, job_id, JobState.COMPLETED)
        await w.stop()
    done = await record(driver, job_id)
    assert done.state is JobState.COMPLETED
    assert done.result["shipped"] is None
    assert fake.calls == {"charge": 1, "email: your order is late": 1}
