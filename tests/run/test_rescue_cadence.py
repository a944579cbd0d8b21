# A worker rescues lapsed jobs once a RESCUE_EVERY at most: its other claims take none
# (rescue=False), and its wait for work counts a lapse as work only from its next rescue.
from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from jobs_trio import Registry
from jobs_trio._core.errors import DriverError
from jobs_trio._core.records import Claim
from jobs_trio._run.claim_loop import RESCUE_AGAIN, RESCUE_EVERY
from tests.helpers.worker_helpers import worker
from tests.run.test_claim_loop import CountingDriver


class RescueCounting(CountingDriver):
    """Records whether each claim (and claim carrying settlements) asked to rescue."""

    def __init__(self) -> None:
        super().__init__()
        self.rescues: list[tuple[float, bool]] = []

    async def claim(self, *args: Any, rescue: bool = True, **kw: Any) -> Sequence[Claim]:
        self.rescues.append((trio.current_time(), rescue))
        # A worker that spins (claim, its look answers "due", claim...) never lets a mock
        # clock move: failed here, or the test would hang until pytest's timeout.
        assert len(self.rescues) < 1000, "the worker claims again and again at one moment"
        return await super().claim(*args, rescue=rescue, **kw)


def _started_at(registry: Registry, name: str, queue: str = "default") -> dict[str, float]:
    started: dict[str, float] = {}

    @registry.job(name, queue=queue)
    async def body(ctx: Any, payload: str) -> None:
        started[payload] = trio.current_time()

    return started


async def _run_until(
    w: Any,
    done: Callable[[], bool],
    *,
    beside: Callable[[], Awaitable[None]] | None = None,
    within: float = 30,
) -> None:
    """Run worker ``w`` (and ``beside``, a task of the test's) until ``done()``."""
    with trio.fail_after(within):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            if beside is not None:
                nursery.start_soon(beside)
            while not done():
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()


async def test_a_lapse_inside_the_cadence_is_taken_at_the_next_rescue_without_a_spin(
    autojump_clock: Any,
) -> None:
    driver = RescueCounting()
    registry = Registry()
    started = _started_at(registry, "j")
    # A job another worker claimed and died holding: its lease lapses at 0.4, before this
    # worker may rescue again (its first claim, at 0, rescued).
    await registry.get("j").enqueue_many(driver, ["lapsed"])  # type: ignore[union-attr]
    await driver.claim(["default"], 1, lease=0.4, worker_id="dead")
    driver.rescues.clear()
    w = worker(driver, registry, concurrency=2, safety_poll=30.0)
    await _run_until(w, lambda: "lapsed" in started, within=10)
    assert RESCUE_EVERY <= started["lapsed"] < RESCUE_EVERY + 0.1
    # The first claim at start, the rescue at RESCUE_EVERY: nothing between.
    assert [rescue for at, rescue in driver.rescues if at < RESCUE_EVERY] == [True]
    assert (RESCUE_EVERY, True) in [(round(at, 3), r) for at, r in driver.rescues]


async def test_a_busy_workers_claims_rescue_once_a_cadence(autojump_clock: Any) -> None:
    driver = RescueCounting()
    registry = Registry()

    @registry.job("step", queue="default")
    async def body(ctx: Any, payload: int) -> None:
        await trio.sleep(0.01)

    w = worker(driver, registry, concurrency=4, safety_poll=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        for _ in range(30):  # 3 s of a steady stream of work
            await registry.get("step").enqueue_many(driver, list(range(8)))  # type: ignore[union-attr]
            await trio.sleep(0.1)
        nursery.cancel_scope.cancel()
    rescuing = [at for at, rescue in driver.rescues if rescue]
    assert len(driver.rescues) > 30  # many claims...
    # ...of which one a cadence rescued: RESCUE_EVERY apart, or RESCUE_AGAIN after a rescuing
    # claim that came back full (more lapsed jobs may wait), never two at one moment.
    assert len(rescuing) <= 3 / RESCUE_AGAIN + 1
    assert len(rescuing) < len(driver.rescues) / 2
    assert all(b - a >= RESCUE_AGAIN for a, b in itertools.pairwise(rescuing))


async def test_a_lapse_in_a_queue_whose_slot_frees_rarely_is_rescued_within_the_cadence(
    autojump_clock: Any,
) -> None:
    # Queue A's slots free all the time, B's one slot every 0.237 s. A rescue walks only the
    # queues its claim names: with one clock for all queues, the claim that rescued once a
    # second was nearly always an A-only one, and B's lapsed job waited out B's whole backlog
    # (40 jobs, 9.5 s). Each queue's own clock rescues it at B's first claim past its cadence.
    driver = RescueCounting()
    registry = Registry()
    started: dict[str, float] = {}

    @registry.job("slow", queue="b")
    async def slow_body(ctx: Any, payload: str) -> None:
        started.setdefault(payload, trio.current_time())
        await trio.sleep(0.237)  # never at the moment an A job ends (0.013 s apart)

    @registry.job("fast", queue="a")
    async def fast(ctx: Any, payload: int) -> None:
        await trio.sleep(0.013)

    slow = registry.require("slow")
    await slow.enqueue_many(driver, ["lapsed"])
    await driver.claim(["b"], 1, lease=0.5, worker_id="dead")
    await trio.sleep(0.01)  # the backlog after it in line: handed back, it runs next
    await slow.enqueue_many(driver, [f"b{n}" for n in range(40)])
    w = worker(driver, registry, concurrency={"a": 4, "b": 1}, claim_ahead=0, safety_poll=30.0)

    async def feed() -> None:
        while True:
            await registry.require("fast").enqueue_many(driver, list(range(20)))
            await trio.sleep(0.031)

    await _run_until(w, lambda: "lapsed" in started, beside=feed, within=20)
    # Lapsed at 0.51; B's claims come a run (0.237 s) apart, and the first past its queue's
    # cadence rescues it.
    assert started["lapsed"] < 0.51 + RESCUE_EVERY + 2 * 0.237


async def test_a_queue_whose_rescue_came_back_full_is_rescued_again_soon(
    autojump_clock: Any,
) -> None:
    # A rescue hands back at most what its claim asks: ten jobs a dead worker held, found by a
    # worker of one slot, came back one a second. A queue whose rescuing claim came back full
    # is rescued again RESCUE_AGAIN later: the ten come back in about a second.
    driver = RescueCounting()
    registry = Registry()
    started: dict[str, float] = {}

    @registry.job("j")
    async def body(ctx: Any, payload: str) -> None:
        started[payload] = trio.current_time()
        await trio.sleep(0.01)

    await registry.require("j").enqueue_many(driver, [f"l{n}" for n in range(10)])
    assert len(await driver.claim(["default"], 10, lease=0.3, worker_id="dead")) == 10
    await trio.sleep(0.4)  # all ten lapsed
    driver.rescues.clear()
    w = worker(driver, registry, concurrency=1, claim_ahead=0, safety_poll=30.0)
    begun = trio.current_time()
    await _run_until(w, lambda: len(started) == 10)
    assert max(started.values()) - begun <= 10 * (RESCUE_AGAIN + 0.01) + 0.1


async def test_one_failed_claim_with_a_short_lease_does_not_hold_the_rescue_back(
    autojump_clock: Any,
) -> None:
    # With a lease of 3 s the renewals come a second apart, and a gap that long counts as an
    # outage (no rescue for a grace after it). One dropped claim, then a pause of the whole poll
    # interval (1 s) before the next, made such a gap: a dead worker's job waited 5 s.
    class FailsOnce(RescueCounting):
        failed = False

        async def claim(self, *args: Any, **kw: Any) -> Sequence[Claim]:
            if not self.failed and trio.current_time() > 0:
                self.failed = True
                raise DriverError("the connection was lost (test)", fix="retry")
            return await super().claim(*args, **kw)

    driver = FailsOnce()
    registry = Registry()
    started = _started_at(registry, "j")
    await registry.require("j").enqueue_many(driver, ["lapsed"])
    await driver.claim(["default"], 1, lease=0.5, worker_id="dead")
    await trio.sleep(0.6)  # lapsed; the next claim fails, once
    w = worker(driver, registry, concurrency=2, lease=3.0, poll_interval=1.0, safety_poll=30.0)
    begun = trio.current_time()
    await _run_until(w, lambda: "lapsed" in started)
    assert driver.failed
    assert started["lapsed"] - begun < 1.0
