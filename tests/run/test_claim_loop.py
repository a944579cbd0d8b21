# The worker's one claim loop for all its queues (issue 20): one claim per round whatever the
# number of queues, each queue capped at its own free slots, and a slot freed in a full queue
# claims again at once although the queues that came up short are still waiting for work.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trio
import trio.testing

from jobs_trio import Registry
from jobs_trio._core.records import Claim
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import worker


class CountingDriver(MemoryDriver):
    """The memory driver on Trio's clock, recording each claim's limit; ``deaf`` makes its
    wait_for_work hear nothing (only its timeout ends it), as a driver without wake-ups."""

    def __init__(self, *, deaf: bool = False) -> None:
        super().__init__(clock=trio.current_time)
        self.claims: list[Mapping[str, int] | int] = []
        self.claimed: list[str] = []  # job ids, in the order the claims answered them
        self.deaf = deaf

    async def claim(
        self,
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
        alone: bool = False,
    ) -> Sequence[Claim]:
        self.claims.append(dict(limit) if isinstance(limit, Mapping) else limit)
        claims = await super().claim(
            queues, limit, lease=lease, worker_id=worker_id, free=free, rescue=rescue, alone=alone
        )
        self.claimed.extend(c.job_id for c in claims)
        return claims

    async def wait_for_work(
        self,
        queues: Sequence[str],
        timeout: float,
        *,
        rescue_from: float | None = None,
        alone: bool = False,
    ) -> None:
        if self.deaf:
            await trio.sleep(timeout)
        else:
            await super().wait_for_work(queues, timeout, rescue_from=rescue_from, alone=alone)


def blocking_registry(queues: Sequence[str]) -> tuple[Registry, dict[str, trio.Event], set[str]]:
    """A job per queue whose runs wait for their payload's event; ``running`` holds the
    payloads of the runs in progress."""
    registry = Registry()
    release: dict[str, trio.Event] = {}
    running: set[str] = set()

    async def body(ctx: object, payload: str) -> None:
        running.add(payload)
        try:
            await release.setdefault(payload, trio.Event()).wait()
        finally:
            running.discard(payload)

    for queue in queues:
        registry.job(f"{queue}.job", queue=queue)(body)
    return registry, release, running


async def test_an_idle_worker_claims_all_its_queues_in_one_claim(autojump_clock: Any) -> None:
    queues = [f"q{i}" for i in range(50)]
    registry, release, running = blocking_registry(queues)
    driver = CountingDriver()
    w = worker(driver, registry, concurrency=3, safety_poll=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(95)  # three safety polls

        # One claim to start and one per safety poll: not one per queue per poll.
        assert driver.claims == [dict.fromkeys(queues, 3)] * 4

        await registry.get("q7.job").enqueue(driver, "a")  # type: ignore[union-attr]
        await trio.testing.wait_all_tasks_blocked()
        assert running == {"a"}
        assert len(driver.claims) == 5  # the wake-up's one claim took it

        await trio.sleep(30)
        # The next look asks q7 only for the slots its run left free.
        assert driver.claims[5] == {**dict.fromkeys(queues, 3), "q7": 2}
        release["a"].set()
        await w.stop()


async def test_a_deep_queue_never_takes_another_queues_slots(autojump_clock: Any) -> None:
    registry, release, running = blocking_registry(["deep", "other"])
    driver = CountingDriver()
    deep = registry.get("deep.job")
    other = registry.get("other.job")
    assert deep is not None and other is not None
    await deep.enqueue_many(driver, [f"d{i}" for i in range(10)])
    await other.enqueue_many(driver, ["o0", "o1"])
    w = worker(driver, registry, concurrency={"deep": 2, "other": 2})
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        # One total of 4, best first, would have been four of deep's (enqueued first).
        assert sorted(name[0] for name in running) == ["d", "d", "o", "o"]
        for name in list(running):
            release.setdefault(name, trio.Event()).set()
        for i in range(2, 10):
            release.setdefault(f"d{i}", trio.Event()).set()
        await w.stop()


async def test_a_slot_freed_in_a_full_queue_claims_again_without_waiting_for_work(
    autojump_clock: Any,
) -> None:
    # "busy" is full (limit 1, two jobs); "empty" came up short, so the loop waits for work
    # there, on a driver that never wakes it. The slot busy frees must end that wait.
    registry, release, running = blocking_registry(["busy", "empty"])
    driver = CountingDriver(deaf=True)
    busy = registry.get("busy.job")
    assert busy is not None
    await busy.enqueue_many(driver, ["b1", "b2"])
    w = worker(driver, registry, concurrency=1, safety_poll=600.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        # One batch ties on run-at and priority; ids break the tie, and their random bits decide
        # which of the two goes first: the test holds for either order.
        [first] = running
        [second] = {"b1", "b2"} - {first}
        started = trio.current_time()
        release[first].set()
        await trio.testing.wait_all_tasks_blocked()
        assert running == {second}
        assert trio.current_time() - started < 1.0  # not at the 600 s safety poll
        release[second].set()
        await w.stop()


async def test_jobs_a_short_claim_returned_start_before_the_loop_looks_for_more(
    autojump_clock: Any,
) -> None:
    # After a claim that came up short the loop looks for more work (on PostgreSQL a round
    # trip it sends before it waits); the jobs it just claimed must not wait behind that send.
    registry, release, running = blocking_registry(["q"])
    seen_at_look: list[set[str]] = []

    class Looking(CountingDriver):
        async def wait_for_work(self, queues: Sequence[str], timeout: float, **kw: Any) -> None:
            seen_at_look.append(set(running))
            await super().wait_for_work(queues, timeout, **kw)

    driver = Looking()
    w = worker(driver, registry, concurrency=3, safety_poll=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(1)
        looks = len(seen_at_look)
        await registry.get("q.job").enqueue_many(driver, ["a", "b"])  # type: ignore[union-attr]
        await trio.sleep(1)
        # One claim took both (two of three slots): the look after it saw both running.
        assert len(driver.claims) == 2 and len(driver.claimed) == 2
        assert seen_at_look[looks:] == [{"a", "b"}], seen_at_look
        for payload in ("a", "b"):
            release.setdefault(payload, trio.Event()).set()
        nursery.cancel_scope.cancel()
