# A worker and a paused queue (DESIGN invariant 12: a paused queue starts nothing anywhere until
# resumed): its running jobs finish, the jobs it holds unstarted (claimed ahead of a slot, or a
# claim answered after the pause was heard) go back uncounted at once, nothing of it starts
# while paused, other queues run on, and a resume runs its jobs. In one process on Trio's mock
# clock; tests/ops/test_dashboard_pause.py pauses two worker processes from a browser.
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio
import trio.testing

import jobs_trio
from jobs_trio import DriverError, JobState, OutcomeKind, Registry
from jobs_trio._core.records import Claim, PauseLook
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import record, trio_driver, worker


def _registry(
    queues: Sequence[str] = ("q",),
) -> tuple[Registry, dict[str, trio.Event], list[str]]:
    """``<queue>.job`` per queue: each run appends its payload to the list answered, then
    waits for the payload's event in the dict (made on first use) unless it is "quick"."""
    registry = Registry()
    release: dict[str, trio.Event] = {}
    started: list[str] = []

    async def body(ctx: object, payload: str) -> None:
        started.append(payload)
        if not payload.startswith("quick"):
            await release.setdefault(payload, trio.Event()).wait()

    for queue in queues:
        registry.job(f"{queue}.job", queue=queue)(body)
    return registry, release, started


async def _enqueue(registry: Registry, driver: MemoryDriver, queue: str, *names: str) -> list[str]:
    job = registry.get(f"{queue}.job")
    assert job is not None
    return [await job.enqueue(driver, name, priority=i) for i, name in enumerate(names)]


async def test_a_pause_hands_back_the_held_jobs_and_starts_nothing_until_resumed(
    autojump_clock: Any,
) -> None:
    registry, release, started = _registry()
    driver = trio_driver()
    ids = await _enqueue(registry, driver, "q", "long", "quick1", "quick2", "quick3")
    w = worker(driver, registry, concurrency=1, claim_ahead=3, hold_limit=600)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        # One running (its body waits), three held for its slot.
        assert started == ["long"] and w.stats().claimed_ahead == 3
        await driver.pause_queue("q")
        await trio.testing.wait_all_tasks_blocked()
        # Heard at once: the held jobs went back unstarted, their attempts uncounted.
        assert w.stats().claimed_ahead == 0 and w.stats().paused == ("q",)
        for job_id in ids[1:]:
            held = await record(driver, job_id)
            assert (held.state, held.attempts) == (JobState.READY, 0), held
        assert w.stats().outcomes[OutcomeKind.INTERRUPTED] == 3
        # The running job finishes; nothing else starts, however long the pause.
        release["long"].set()
        await trio.sleep(3600)
        assert started == ["long"]
        assert (await record(driver, ids[0])).state is JobState.COMPLETED
        await driver.resume_queue("q")
        await trio.sleep(1)
        assert started == ["long", "quick1", "quick2", "quick3"]
        assert w.stats().paused == ()
        nursery.cancel_scope.cancel()
    for job_id in ids[1:]:
        done = await record(driver, job_id)
        assert (done.state, done.attempts) == (JobState.COMPLETED, 1)


async def test_a_queue_paused_before_the_worker_starts_runs_nothing_and_others_run_on(
    autojump_clock: Any,
) -> None:
    registry, _, started = _registry(("a", "b"))
    driver = trio_driver()
    await driver.pause_queue("a")
    await _enqueue(registry, driver, "a", "quick-a")
    await _enqueue(registry, driver, "b", "quick-b")
    w = worker(driver, registry, concurrency=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert w.stats().paused == ("a",)
        await trio.sleep(3600)
        assert started == ["quick-b"]
        await driver.resume_queue("a")
        await trio.sleep(1)
        assert started == ["quick-b", "quick-a"]
        nursery.cancel_scope.cancel()


class _HeldAnswers(MemoryDriver):
    """The memory driver on Trio's clock whose claims commit at once and answer only when
    ``answer`` is set: a claim in flight across a pause."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.answer = trio.Event()
        self.in_flight = trio.Event()

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
        claims = await super().claim(
            queues, limit, lease=lease, worker_id=worker_id, free=free, rescue=rescue, alone=alone
        )
        if claims:
            self.in_flight.set()
            await self.answer.wait()
        return claims


async def test_a_claim_answered_after_the_pause_was_heard_starts_nothing(
    autojump_clock: Any,
) -> None:
    registry, _, started = _registry()
    driver = _HeldAnswers()
    ids = await _enqueue(registry, driver, "q", "quick1", "quick2")
    w = worker(driver, registry, concurrency=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await driver.in_flight.wait()  # committed: both jobs are running in the database
        await driver.pause_queue("q")
        await trio.testing.wait_all_tasks_blocked()
        assert w.stats().paused == ("q",)
        driver.answer.set()
        await trio.sleep(3600)
        assert started == []
        for job_id in ids:
            back = await record(driver, job_id)
            assert (back.state, back.attempts) == (JobState.READY, 0), back
        await driver.resume_queue("q")
        await trio.sleep(1)
        assert sorted(started) == ["quick1", "quick2"]
        nursery.cancel_scope.cancel()


async def test_a_worker_started_again_hears_a_resume_made_while_it_was_stopped(
    autojump_clock: Any,
) -> None:
    registry, _, started = _registry()
    driver = trio_driver()
    await driver.pause_queue("q")
    w = worker(driver, registry, concurrency=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert w.stats().paused == ("q",)
        await w.stop()
        await driver.resume_queue("q")  # while it is stopped
        await _enqueue(registry, driver, "q", "quick")
        await nursery.start(w.run)
        await trio.sleep(1)
        assert started == ["quick"] and w.stats().paused == ()
        nursery.cancel_scope.cancel()


class _Confirmations(MemoryDriver):
    """The memory driver on Trio's clock that records each confirmation a worker writes, with
    what the worker held unstarted at that moment; the first ``fail`` of them fail."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__(clock=trio.current_time)
        self.written: list[tuple[int, int]] = []  # (epoch, jobs held for a slot then)
        self.fail = fail
        self.held_now: Callable[[], int] = lambda: 0

    async def pauses_heard(self, worker_id: str, epoch: int) -> None:
        if self.fail:
            self.fail -= 1
            raise DriverError("the database is away", fix="wait")
        self.written.append((epoch, self.held_now()))
        await super().pauses_heard(worker_id, epoch)


async def test_a_worker_confirms_a_pause_once_its_held_jobs_went_back(
    autojump_clock: Any,
) -> None:
    registry, release, started = _registry(("q", "other"))
    driver = _Confirmations(fail=1)
    await _enqueue(registry, driver, "q", "long", "quick1", "quick2")
    w = worker(driver, registry, concurrency=1, claim_ahead=2, hold_limit=600, poll_interval=1)
    driver.held_now = lambda: w.stats().claimed_ahead
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert started == ["long"] and w.stats().claimed_ahead == 2
        # A pause of a queue this worker does not claim, and none of its own: nothing to say.
        await driver.pause_queue("elsewhere")
        await trio.testing.wait_all_tasks_blocked()
        assert driver.written == []
        with trio.fail_after(10):  # the first write fails: tried again after poll_interval
            answer = await jobs_trio.pause_queue(driver, "q")
        assert answer.confirmed and answer.heard == (w.worker_id,)
        # Written once, after the held jobs went back (none held at that moment).
        assert driver.written == [(answer.pause.epoch, 0)]
        release["long"].set()
        await trio.sleep(60)
        assert started == ["long"]
        nursery.cancel_scope.cancel()


async def test_a_pause_waits_for_a_worker_whose_watch_is_late(autojump_clock: Any) -> None:
    # The worker's confirmation is written late (its watch looks every safety_poll; here its
    # wake-up is lost): the pause returns then, not at its commit; past `within`, it names it.
    registry, _, started = _registry()
    driver = _Deaf()
    await _enqueue(registry, driver, "q", "long", "quick1")
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=600, safety_poll=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert w.stats().claimed_ahead == 1
        paused_at = trio.current_time()
        answer = await jobs_trio.pause_queue(driver, "q", within=0.5)
        [silent] = answer.unconfirmed
        assert (silent.worker_id, silent.jobs) == (w.worker_id, 2)
        assert "may start the ones it holds for a slot" in silent.why(driver.now())
        answer = await jobs_trio.pause_queue(driver, "q", within=3600)
        assert answer.confirmed and answer.heard == (w.worker_id,)
        # Heard at the watch's own next look, not before: the pause waited for it.
        assert trio.current_time() - paused_at >= w.options.safety_poll - 0.5
        assert w.stats().claimed_ahead == 0 and started == ["long"]
        nursery.cancel_scope.cancel()


class _Deaf(MemoryDriver):
    """The memory driver on Trio's clock whose watch on pauses hears no wake-up: it sees a
    change only when its wait times out (a SQLite worker in another process, or one whose
    LISTEN is down)."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)

    async def wait_for_pauses(self, seen: int | None, timeout: float) -> PauseLook:
        look = await super().wait_for_pauses(None, 0)
        if look.epoch == seen:
            await trio.sleep(timeout)
        return await super().wait_for_pauses(None, 0)
