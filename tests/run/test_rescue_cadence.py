# A worker rescues lapsed jobs once a RESCUE_EVERY at most: its other claims take none
# (rescue=False), and its wait for work counts a lapse as work only from its next rescue.
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import trio

from jobs_trio import Registry
from jobs_trio._core.records import Claim
from jobs_trio._run.claim_loop import RESCUE_EVERY
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
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            while "lapsed" not in started:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
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
    assert len(rescuing) <= 3 / RESCUE_EVERY + 1  # ...of which one a cadence rescued
    assert all(b - a >= RESCUE_EVERY for a, b in itertools.pairwise(rescuing))
