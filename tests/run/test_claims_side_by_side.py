# Claims side by side (issue 35): where the driver serves claims at once, a worker with work
# waiting sends its next claim before the last is answered; never more than two, never for the
# slots and room a claim in flight will fill, and never while its queues are empty.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import trio

from jobs_trio import Registry
from jobs_trio._core.errors import DriverError
from jobs_trio._core.records import Claim, JobState, Settlement
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import worker

CLAIM_SECONDS = 0.01  # each claim's round trip, on Trio's mock clock


class SlowClaims(MemoryDriver):
    """A claim answers ``seconds`` after it is sent (a server working on it); counts the
    claims in flight at once, and the most jobs this worker ever had claimed and unsettled."""

    def __init__(self, *, side_by_side: bool, seconds: float = CLAIM_SECONDS) -> None:
        super().__init__(clock=trio.current_time)
        self.capabilities = attrs.evolve(
            MemoryDriver.capabilities, claims_side_by_side=side_by_side
        )
        self.seconds = seconds
        self.in_flight = 0
        self.most_in_flight = 0
        self.claims = 0
        self.most_unsettled = 0

    async def claim(self, queues: Sequence[str], limit: Any, **options: Any) -> Sequence[Claim]:
        self.in_flight += 1
        self.claims += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await trio.sleep(self.seconds)
            return await super().claim(queues, limit, **options)
        finally:
            self.in_flight -= 1
            running = sum(
                1 for r in await self.list_jobs(limit=10_000) if r.state is JobState.RUNNING
            )
            self.most_unsettled = max(self.most_unsettled, running)

    async def settle_and_claim(
        self, settlements: Sequence[Settlement], queues: Sequence[str], limit: Any, **options: Any
    ) -> tuple[Sequence[str], Sequence[Claim]]:
        applied = await MemoryDriver.settle(self, settlements)
        return applied, await self.claim(queues, limit, **options)


def quick_jobs(registry: Registry) -> Any:
    @registry.job("quick")
    async def quick(ctx: Any, payload: int) -> None:
        await trio.sleep(0.001)

    return quick


async def run_all(driver: SlowClaims, jobs: int, **options: Any) -> None:
    registry = Registry()
    quick = quick_jobs(registry)
    await driver.enqueue([quick.new_job(n) for n in range(jobs)])
    w = worker(driver, registry, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(10)
        await w.stop()
    states = {r.state for r in await driver.list_jobs(limit=10_000)}
    assert states == {JobState.COMPLETED}


@pytest.mark.parametrize("side_by_side", [True, False], ids=["side-by-side", "one-at-a-time"])
async def test_with_work_waiting_two_claims_go_side_by_side_and_never_claim_past_the_room(
    autojump_clock: object, side_by_side: bool
) -> None:
    # A driver that does not declare it gets one claim at a time.
    driver = SlowClaims(side_by_side=side_by_side)
    await run_all(driver, 500, concurrency=8, claim_ahead=16)
    assert driver.most_in_flight == (2 if side_by_side else 1)
    # What a claim in flight will bring is left to it: the next asks only for the rest.
    assert driver.most_unsettled <= 8 + 16


async def test_side_by_side_claims_take_the_queue_in_fewer_round_trips_of_time(
    autojump_clock: object,
) -> None:
    # The point of it: the worker runs the last claim's jobs while the next claim is served.
    finished = {}
    for side_by_side in (False, True):
        driver = SlowClaims(side_by_side=side_by_side)
        registry = Registry()
        quick = quick_jobs(registry)
        await driver.enqueue([quick.new_job(n) for n in range(400)])
        w = worker(driver, registry, concurrency=8, claim_ahead=16)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            while any(r.state is not JobState.COMPLETED for r in await driver.list_jobs(limit=500)):
                await trio.sleep(0.001)
            finished[side_by_side] = trio.current_time() - start
            await w.stop()
    assert finished[True] < 0.8 * finished[False], finished


async def test_after_a_short_answer_a_freed_slot_waits_for_the_claim_in_flight(
    autojump_clock: object,
) -> None:
    # A claim that came up short says the queue is drained: a slot that frees while the next
    # claim is in flight does not send another beside it (the idle cost stays one statement
    # per look, issue 20). Claims take 0.5 s: the first answers at 0.5 with a (0.8 s, one of
    # four slots); b, enqueued at 1.0, wakes a claim in flight until 1.5; a ends at 1.3.
    driver = SlowClaims(side_by_side=True, seconds=0.5)
    registry = Registry()
    quick = quick_jobs(registry)

    @registry.job("slow")
    async def slow(ctx: Any, seconds: float) -> None:
        await trio.sleep(seconds)

    await slow.enqueue(driver, 0.8)
    w = worker(driver, registry, concurrency=4, claim_ahead=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(1.0)
        await quick.enqueue(driver, 0)
        await trio.sleep(4)
        await w.stop()
    assert driver.claims >= 2
    assert driver.most_in_flight == 1


class AnswersLate(MemoryDriver):
    """Each claim commits when sent and is answered ``latency[n]`` (n counted from 1) later,
    1 ms by default: a later claim may be answered first. Records what each claim marked
    ahead, and when a lost answer's jobs were handed back."""

    def __init__(self, latency: dict[int, float], *, lose: int = 0) -> None:
        super().__init__(clock=trio.current_time)
        self.latency, self.lose = latency, lose
        self.n = 0
        self.claimed: dict[str, bool] = {}
        self.lost_at: float | None = None
        self.handed_back_at: list[float] = []

    async def claim(self, queues: Sequence[str], limit: Any, **options: Any) -> Sequence[Claim]:
        self.n += 1
        n = self.n
        claims = await super().claim(queues, limit, **options)
        self.claimed.update((c.job_id, c.ahead) for c in claims)
        await trio.sleep(self.latency.get(n, 0.001))
        if n == self.lose:
            self.lost_at = trio.current_time()
            raise DriverError("the connection dropped (test)", fix="none")
        return claims

    async def hand_back_unheld(self, *args: Any, **options: Any) -> Any:
        self.handed_back_at.append(trio.current_time())
        return await super().hand_back_unheld(*args, **options)


async def test_a_claim_answered_first_leaves_the_free_slots_promised_to_the_one_sent_before_it(
    autojump_clock: object,
) -> None:
    # Found by review: claim 3, sent beside the slow claim 2 and answered first, gave its
    # jobs the free slot claim 2's job was marked for; that one was held instead (marked not
    # ahead), and a crash charged it an attempt it never ran.
    registry = Registry()
    started: set[str] = set()

    @registry.job("j")
    async def j(ctx: Any, seconds: float) -> None:
        started.add(ctx.job_id)
        await trio.sleep(seconds)

    driver = AnswersLate({2: 0.1})
    for seconds in (0.03, 0.035, 1.0, 1.0, 1.0, 1.0):
        await driver.enqueue([j.new_job(seconds)])
        await trio.sleep(0.001)
    w = worker(driver, registry, concurrency=2, claim_ahead="auto")
    # The pace as a run of jobs this long sets it: the first run's end claims none ahead,
    # the second's one.
    w._slots._paces["default"].mean = 0.0414
    with trio.CancelScope() as crash:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.sleep(0.5)
            crash.cancel()  # as kill -9: nothing handed back
    never_ran = [job_id for job_id in driver.claimed if job_id not in started]
    await trio.sleep(10)  # past every lease
    again = await driver.claim(["default"], 10, lease=8.0, worker_id="next")
    charged = {c.job_id: c.attempt for c in again if c.job_id in never_ran}
    assert charged and all(a == 1 for a in charged.values()), (charged, driver.claimed)


async def test_a_lost_answer_beside_a_short_one_is_handed_back_after_the_poll_pause(
    autojump_clock: object,
) -> None:
    # Found by review: claim 3's short answer sent the loop to wait for work, and claim 2's
    # lost jobs waited a whole lease to be handed back, not poll_interval.
    registry = Registry()

    @registry.job("sleepy")
    async def sleepy(ctx: Any, seconds: float) -> None:
        await trio.sleep(seconds)

    driver = AnswersLate({1: 0.1, 2: 2.0}, lose=2)
    await driver.enqueue([sleepy.new_job(s) for s in (0.5, 1.0, 0.1)])
    w = worker(driver, registry, concurrency=2, claim_ahead=0, poll_interval=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(30)
        await w.stop()
    assert driver.lost_at is not None
    assert driver.handed_back_at and driver.handed_back_at[0] <= driver.lost_at + 0.6, (
        driver.lost_at,
        driver.handed_back_at,
    )
