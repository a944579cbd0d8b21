# Claims taken ahead of a free slot (the worker's claim_ahead): held like running jobs — renewed,
# reached by a drain, handed back uncounted — and run in claim order as slots free, never left
# behind a long job past the hold limit.
from __future__ import annotations

import threading
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from jobs_trio import ConfigError, JobContext, JobState, OutcomeKind, Registry
from jobs_trio._core.records import Retry
from jobs_trio._run.worker import Worker, WorkerState
from jobs_trio.driver import Capabilities
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import record, trio_driver, worker
from tests.run.test_claim_loop import CountingDriver, blocking_registry
from tests.run.test_settle_path import FaultyDriver


async def _enqueue(registry: Registry, driver: MemoryDriver, names: list[str]) -> list[str]:
    """One job per name, in this order of priority (the memory driver breaks ties by id)."""
    job = registry.get("q.job")
    assert job is not None
    return [await job.enqueue(driver, name, priority=i) for i, name in enumerate(names)]


def _recording_registry(
    quick: str | None = None,
) -> tuple[Registry, dict[str, trio.Event], list[str]]:
    """``q.job`` (queue ``q``): each run appends its payload to the list answered, then waits
    for the payload's event in the dict (made on first use) — except the payload ``quick``,
    which ends at once."""
    registry = Registry()
    release: dict[str, trio.Event] = {}
    started: list[str] = []

    @registry.job("q.job", queue="q")
    async def body(ctx: object, payload: str) -> None:
        started.append(payload)
        if payload != quick:
            await release.setdefault(payload, trio.Event()).wait()

    return registry, release, started


async def _drained_once_running(nursery: trio.Nursery, w: Worker, started: trio.Event) -> float:
    """Start ``w``, and drain it (SIGTERM, 25 s grace) once a body has started and every claim
    is held; answers when."""
    await nursery.start(w.run)
    await started.wait()
    await trio.testing.wait_all_tasks_blocked()
    t0 = trio.current_time()
    w.accept("SIGTERM")
    w.bind(t0 + 25)
    return t0


@pytest.mark.parametrize("side_by_side", [True, False], ids=["side-by-side", "one-at-a-time"])
async def test_claims_ahead_run_in_claim_order_without_a_claim_each(
    autojump_clock: Any, side_by_side: bool
) -> None:
    registry, release, running = blocking_registry(["q"])
    driver = CountingDriver()
    driver.capabilities = attrs.evolve(driver.capabilities, claims_side_by_side=side_by_side)
    ids = await _enqueue(registry, driver, [f"j{i}" for i in range(6)])
    name_of = dict(zip(ids, [f"j{i}" for i in range(6)], strict=True))
    started: list[str] = []
    w = worker(driver, registry, concurrency=1, claim_ahead=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        # One claim for the free slot and four ahead: five jobs claimed, one running.
        assert driver.claims == [{"q": 5}]
        assert len(driver.claimed) == 5 and running == {name_of[driver.claimed[0]]}
        assert (w.stats().in_flight, w.stats().claimed_ahead) == (1, 4)
        states = sorted([(await record(driver, i)).state for i in ids])
        assert states == sorted([JobState.RUNNING] * 5 + [JobState.READY])
        for _ in range(6):
            (name,) = running
            started.append(name)
            release.setdefault(name, trio.Event()).set()
            await trio.testing.wait_all_tasks_blocked()
        await w.stop()
    # The queue's order (as the claims answered it): no claim overtook an older one.
    assert started == [name_of[i] for i in driver.claimed]
    assert (w.stats().in_flight, w.stats().claimed_ahead) == (0, 0)
    # Four held: the second claim went out once a quarter of the room ahead had freed (one
    # start), for it carried that job's settlement, which a round trip writes anyway (a claim
    # that carries none waits for half of it, two starts): it asked for one, j5. A driver that
    # answers one call at a time (SQLite's door) waits for half even so: fewer, larger calls.
    assert driver.claims[:2] == [{"q": 5}, {"q": 1 if side_by_side else 2}]
    for job_id in ids:
        r = await record(driver, job_id)
        assert (r.state, r.attempts) == (JobState.COMPLETED, 1)


async def test_a_drain_hands_held_claims_back_unstarted_and_uncounted(autojump_clock: Any) -> None:
    registry = Registry()
    ran: list[str] = []
    first_started = trio.Event()

    @registry.job("q.job", queue="q", attempts=1)
    async def job(ctx: JobContext, payload: str) -> None:
        ran.append(payload)
        first_started.set()
        await trio.sleep_forever()  # unwinds at the drain: interrupted

    driver = CountingDriver()
    ids = list(await job.enqueue_many(driver, ["a", "b", "c"]))
    w = worker(driver, registry, concurrency=1, claim_ahead=2)
    async with trio.open_nursery() as nursery:
        t0 = await _drained_once_running(nursery, w, first_started)
        await w.stop()
        assert trio.current_time() == t0  # nothing waited for: no body ran on, none was held
    assert len(ran) == 1  # the running one; the two held never started
    for job_id in ids:
        r = await record(driver, job_id)
        # attempts=1 and still ready at once: a spent attempt would have dead-lettered them.
        assert (r.state, r.attempts) == (JobState.READY, 0)
        assert r.last_error is not None and "X_DRAINING" in r.last_error
    assert w.stats().interrupted == 3


async def test_a_drain_hands_held_claims_back_at_once_while_the_running_body_unwinds(
    autojump_clock: Any,
) -> None:
    registry = Registry()
    first_started = trio.Event()
    unwound = trio.Event()

    @registry.job("q.job", queue="q")
    async def job(ctx: JobContext, payload: str) -> None:
        first_started.set()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)  # a body that takes 5 s to unwind
            unwound.set()

    driver = CountingDriver()
    ids = [await job.enqueue(driver, name, priority=i) for i, name in enumerate("abc")]
    w = worker(driver, registry, concurrency=1, claim_ahead=2)
    async with trio.open_nursery() as nursery:
        t0 = await _drained_once_running(nursery, w, first_started)
        await trio.testing.wait_all_tasks_blocked()
        # The held two are back in the queue at once (another worker may take them now),
        # not when the running body has unwound or their hold limit has passed.
        assert trio.current_time() == t0 and not unwound.is_set()
        for job_id in ids[1:]:
            assert (await record(driver, job_id)).state is JobState.READY
        assert (await record(driver, ids[0])).state is JobState.RUNNING
        await w.stop()
        assert trio.current_time() == t0 + 5


async def test_a_handed_back_queue_claims_nothing_ahead_while_other_queues_wake_the_loop(
    autojump_clock: Any,
) -> None:
    registry, release, running = blocking_registry(["q", "other"])
    driver = CountingDriver()
    q, other = registry.get("q.job"), registry.get("other.job")
    assert q is not None and other is not None
    await q.enqueue(driver, "long", priority=0)
    short = await q.enqueue(driver, "short", priority=1)
    for i in range(8):
        await other.enqueue(driver, f"o{i}", priority=i)
    w = worker(
        driver,
        registry,
        concurrency={"q": 1, "other": 1},
        claim_ahead={"q": 1},
        hold_limit=2.0,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert driver.claims == [{"q": 2, "other": 1}]
        # Each of other's jobs ends 5 s apart: each end wakes the claim loop, and each time q
        # has room ahead again — claiming into it would only hand "short" back again.
        for i in range(8):
            await trio.sleep(5)
            release.setdefault(f"o{i}", trio.Event()).set()
            await trio.testing.wait_all_tasks_blocked()
        assert (await record(driver, short)).state is JobState.READY
        assert [c for c in driver.claims[1:] if "q" in c] == []
        assert w.stats().interrupted == 1  # handed back once
        release.setdefault("long", trio.Event()).set()
        await trio.testing.wait_all_tasks_blocked()
        # The long job's end frees q's slot: short is claimed and run.
        assert running == {"short"}
        release.setdefault("short", trio.Event()).set()
        await w.stop()


async def test_a_held_claim_is_handed_back_at_its_hold_limit_and_not_claimed_again(
    autojump_clock: Any,
) -> None:
    registry, release, running = blocking_registry(["q"])
    driver = CountingDriver()
    _, short_id = await _enqueue(registry, driver, ["long", "short"])
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=2.0)
    other = worker(driver, registry, concurrency=1, worker_id="other")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert running == {"long"}
        assert (await record(driver, short_id)).state is JobState.RUNNING  # held by w
        await trio.sleep(2.5)
        r = await record(driver, short_id)
        assert (r.state, r.attempts) == (JobState.READY, 0)  # handed back, uncounted
        assert r.last_error is not None and "X_HANDED_BACK" in r.last_error
        # While its long job runs, w claims nothing ahead again (it would only hand the job
        # back again, every hold limit): one claim in all, and the job waits for any worker.
        await trio.sleep(40)  # within the job's default 60 s timeout
        assert len(driver.claims) == 1
        await nursery.start(other.run)
        await trio.testing.wait_all_tasks_blocked()
        assert running == {"long", "short"}  # the other worker runs it
        release["long"] = trio.Event()
        release["long"].set()
        release["short"] = trio.Event()
        release["short"].set()
        await w.stop()
        await other.stop()
    assert (await record(driver, short_id)).attempts == 1
    assert w.stats().interrupted == 1


async def test_a_held_claim_keeps_its_lease_and_its_timeout_counts_from_its_start(
    autojump_clock: Any,
) -> None:
    registry = Registry()
    timed_out: list[str] = []

    @registry.job("q.job", queue="q", timeout=5.0)
    async def job(ctx: JobContext, seconds: float) -> None:
        try:
            await trio.sleep(seconds)
        except trio.Cancelled:
            timed_out.append(ctx.job_id)
            raise

    driver = CountingDriver()
    first, second = await job.enqueue_many(driver, [4.0, 4.0])
    # Held 4 s behind the first job with an 8 s lease and a 30 s hold limit, then run 4 s:
    # its 5 s timeout counts from its start, and its lease was renewed while it waited.
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=30.0, lease=3.0)
    rival = worker(driver, registry, concurrency=1, worker_id="rival")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        await nursery.start(rival.run)
        await trio.sleep(20)
        await w.stop()
        await rival.stop()
    assert timed_out == []
    for job_id in (first, second):
        r = await record(driver, job_id)
        assert (r.state, r.attempts) == (JobState.COMPLETED, 1)  # once each: no rival run
    assert rival.stats().outcomes == dict.fromkeys(rival.stats().outcomes, 0)


async def test_stop_runs_the_held_claims(autojump_clock: Any) -> None:
    registry, release, running = blocking_registry(["q"])
    driver = CountingDriver()
    ids = await _enqueue(registry, driver, ["a", "b", "c"])
    w = worker(driver, registry, concurrency=1, claim_ahead=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(w.stop)  # waits for the jobs in flight, held ones included
        for name in ("a", "b", "c"):
            await trio.testing.wait_all_tasks_blocked()
            assert running == {name}
            release.setdefault(name, trio.Event()).set()
    for job_id in ids:
        assert (await record(driver, job_id)).state is JobState.COMPLETED
    assert len(driver.claims) == 1


async def test_a_worker_cancelled_from_outside_while_it_holds_claims_runs_again_restarted(
    autojump_clock: Any,
) -> None:
    registry, release, started = _recording_registry()
    driver = CountingDriver()
    ids = await _enqueue(registry, driver, ["a", "b", "c"])
    w = worker(driver, registry, concurrency=1, claim_ahead=2, lease=3.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert (w.stats().in_flight, w.stats().claimed_ahead) == (1, 2)
        nursery.cancel_scope.cancel()  # the application's own scope goes away
    # No held claim started its body while the worker was going away (the running job's end
    # frees a slot, which must not start the next one), and nothing of that run is still
    # counted: not that slot, nor a held claim left queued for the next slot.
    assert started == ["a"]
    assert (w.stats().in_flight, w.stats().claimed_ahead) == (0, 0)
    await trio.sleep(10)  # nothing was written for them: their leases lapse
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert (w.stats().in_flight, w.stats().claimed_ahead) == (1, 2)
        nursery.start_soon(w.stop)
        for name in ("a", "b", "c"):
            await trio.testing.wait_all_tasks_blocked()
            assert started[-1] == name
            release.setdefault(name, trio.Event()).set()
    assert started == ["a", "a", "b", "c"]
    # The lapse cost nobody an attempt: the job that ran was orphaned (docs/model.md, "A
    # worker's death"), the two held ones, never started, were handed back as they were
    # (Claim.ahead), not even orphaned.
    finished = [await record(driver, job_id) for job_id in ids]
    assert [(r.state, r.attempts, r.orphans) for r in finished] == [
        (JobState.COMPLETED, 1, 1),
        (JobState.COMPLETED, 1, 0),
        (JobState.COMPLETED, 1, 0),
    ]
    assert (w.stats().in_flight, w.stats().claimed_ahead) == (0, 0)


@pytest.mark.parametrize("renewed_after_start", [False, True])
async def test_a_held_job_started_is_orphaned_by_a_crash_once_a_renewal_records_it(
    autojump_clock: Any, renewed_after_start: bool
) -> None:
    registry, _, started = _recording_registry(quick="quick")
    driver = CountingDriver()
    ids = await _enqueue(registry, driver, ["quick", "promoted", "held"])
    # Lease 3 s: renewed every second.
    w = worker(driver, registry, concurrency=1, claim_ahead=2, lease=3.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        # "quick" ended at once and handed its slot to "promoted", claimed ahead; "held" waits.
        assert started == ["quick", "promoted"]
        assert (w.stats().in_flight, w.stats().claimed_ahead) == (1, 1)
        if renewed_after_start:
            await trio.sleep(1.5)  # a renewal records the promoted one's start
        nursery.cancel_scope.cancel()  # the worker dies (as far as the database can tell)
    await trio.sleep(10)  # their leases lapse
    again = await driver.claim(["q"], 2, lease=30, worker_id="next")
    assert {c.job_id: c.attempt for c in again} == {ids[1]: 1, ids[2]: 1}  # nobody charged
    # Once its start is recorded a run is orphaned, as any running job is; before that the
    # database cannot tell it from the held one beside it, which never started: both handed back
    # as they were.
    orphans = [(await record(driver, job_id)).orphans for job_id in ids[1:]]
    assert orphans == [1 if renewed_after_start else 0, 0]


async def test_claim_ahead_with_a_driver_that_cannot_mark_claims_ahead_is_refused() -> None:
    class OldDriver(MemoryDriver):
        # A driver declaring no claims ahead (Capabilities): its claim() takes no free=.
        capabilities = Capabilities(settles_with_claims=True)

        async def claim(  # type: ignore[override]
            self, queues: Any, limit: Any, *, lease: float, worker_id: str
        ) -> Any:
            return await super().claim(queues, limit, lease=lease, worker_id=worker_id)

    registry, _, _ = blocking_registry(["q"])
    with pytest.raises(ConfigError, match="does not declare it") as refused:
        worker(OldDriver(), registry, claim_ahead=4)
    assert "claim_ahead at 0" in str(refused.value)
    worker(OldDriver(), registry)  # without claiming ahead it is asked nothing new


class StuckThread:
    """``q.stuck``: a sync body whose thread blocks until ``release`` (30 s at most), never
    polling its cancel, so a cancel abandons it and its thread keeps its slot until it ends."""

    def __init__(self, registry: Registry, timeout: float | None = None) -> None:
        self.started, self.release, self.ended = (threading.Event() for _ in range(3))

        @registry.job("q.stuck", queue="q", timeout=timeout)
        def stuck(ctx: JobContext, payload: None) -> None:
            self.started.set()
            try:
                self.release.wait(30)
            finally:
                self.ended.set()

        self.job = stuck


async def test_a_held_claim_that_gets_the_slot_of_an_abandoned_thread_reads_as_running() -> None:
    registry = Registry()
    stuck = StuckThread(registry, timeout=0.2)  # past it: abandoned, its thread keeps the slot
    started, release_thread, ended = stuck.started, stuck.release, stuck.ended
    release: dict[str, trio.Event] = {"a": trio.Event(), "b": trio.Event()}
    running: set[str] = set()

    @registry.job("q.quick", queue="q")
    async def quick(ctx: JobContext, payload: str) -> None:
        running.add(payload)
        try:
            await release[payload].wait()
        finally:
            running.discard(payload)

    driver = trio_driver()
    await stuck.job.enqueue(driver, priority=0)
    await quick.enqueue(driver, "a", priority=1)
    await quick.enqueue(driver, "b", priority=2)
    w = worker(driver, registry, concurrency=1, claim_ahead=2, hold_limit=30.0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.to_thread.run_sync(started.wait)
            with trio.fail_after(5):
                while w.stats().in_flight:  # the stuck one's timeout: settled, slot lingering
                    await trio.sleep(0.01)
            assert w._slots.threads.lingering("q") == 1
            assert (w.state, w.stats().claimed_ahead) == (WorkerState.RUNNING, 2)
            release_thread.set()
            await trio.to_thread.run_sync(ended.wait)
            with trio.fail_after(5):
                while running != {"a"}:  # the thread's end hands its slot to "a"
                    await trio.sleep(0.01)
            stats = w.stats()
            assert (stats.state, stats.in_flight, stats.claimed_ahead) == (
                WorkerState.RUNNING,
                1,
                1,
            )
            release["a"].set()
            release["b"].set()
            with trio.fail_after(5):
                while w.stats().outcomes[OutcomeKind.COMPLETED] < 2:
                    await trio.sleep(0.01)
            assert (w.state, w.stats().in_flight, w.stats().claimed_ahead) == (
                WorkerState.IDLE,
                0,
                0,
            )
            await w.stop()
    finally:
        release_thread.set()


async def test_claims_held_behind_a_thread_when_the_worker_is_cancelled_never_start() -> None:
    """The worker is cancelled from outside while its one slot is a sync body's thread (which
    a cancel abandons, so the slot is still taken when the worker's nurseries end) and two
    claims wait for it. Those two must be dropped there: left queued, the thread's end would
    hand its slot to one of them after the worker had gone (its nursery closed), and they
    would still read as held."""
    registry = Registry()
    stuck = StuckThread(registry)  # deaf to its cancel: abandoned, it keeps the slot
    started, release_thread, ended = stuck.started, stuck.release, stuck.ended
    ran: list[str] = []

    @registry.job("q.quick", queue="q")
    async def quick(ctx: JobContext, payload: str) -> None:
        ran.append(payload)

    driver = trio_driver()
    await stuck.job.enqueue(driver, priority=0)
    await quick.enqueue(driver, "a", priority=1)
    await quick.enqueue(driver, "b", priority=2)
    w = worker(driver, registry, concurrency=1, claim_ahead=2, hold_limit=30.0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.to_thread.run_sync(started.wait)
            assert w.stats().claimed_ahead == 2
            nursery.cancel_scope.cancel()  # the application's own scope goes away
        assert w.stats().claimed_ahead == 0
        release_thread.set()
        await trio.to_thread.run_sync(ended.wait)
        await trio.testing.wait_all_tasks_blocked()
        assert ran == [] and w.stats().claimed_ahead == 0
    finally:
        release_thread.set()


async def test_an_operator_cancel_ends_a_held_claims_wait_and_it_never_starts(
    autojump_clock: Any,
) -> None:
    registry, release, running = blocking_registry(["q"])
    driver = CountingDriver()
    _, b, _ = await _enqueue(registry, driver, ["a", "b", "c"])
    started: list[str] = []
    w = worker(driver, registry, concurrency=1, claim_ahead=2, hold_limit=30.0, lease=3.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        await driver.cancel(b)
        await trio.sleep(2)  # the next renewal (every lease / 3) hears it
        assert (await record(driver, b)).state is JobState.CANCELLED
        assert (w.stats().in_flight, w.stats().claimed_ahead) == (1, 1)
        for _ in range(2):
            (name,) = running
            started.append(name)
            release.setdefault(name, trio.Event()).set()
            await trio.testing.wait_all_tasks_blocked()
        await w.stop()
    assert started == ["a", "c"]  # b never started; c took the slot a freed
    assert w.stats().outcomes[OutcomeKind.CANCELLED] == 1


async def test_a_drain_landing_as_a_slot_is_handed_to_a_held_claim_hands_it_back_unstarted(
    autojump_clock: Any,
) -> None:
    registry, release, running = blocking_registry(["q"])
    driver = CountingDriver()
    a, b = await _enqueue(registry, driver, ["a", "b"])
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=30.0)
    promote = w._slots._promote
    granted: list[str] = []

    def promote_then_drain(queue: str, now: float | None = None) -> None:
        promote(queue, now)  # b is granted a's slot; its task has not run yet
        if w.stats().in_flight and not granted:
            granted.append(queue)
            w.accept("SIGTERM")

    w._slots._promote = promote_then_drain  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert running == {"a"}
        release.setdefault("a", trio.Event()).set()
        await trio.testing.wait_all_tasks_blocked()
        assert granted == ["q"]
        await w.stop()
    assert (await record(driver, a)).state is JobState.COMPLETED
    r = await record(driver, b)
    assert (r.state, r.attempts) == (JobState.READY, 0)
    assert r.last_error is not None and "X_DRAINING" in r.last_error
    assert "b" not in release  # its body never ran
    assert (w.stats().in_flight, w.stats().claimed_ahead) == (0, 0)


class SlowHandBack(CountingDriver):
    """Writes a held claim's hand-back (an uncounted retry) only once ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.handing_back = trio.Event()

    async def settle(self, settlements: Any) -> Any:
        if any(isinstance(s, Retry) and s.hands_back for s in settlements):
            self.handing_back.set()
            await self.gate.wait()
        return await super().settle(settlements)


async def test_a_drain_landing_during_a_hold_limit_hand_back_keeps_it_handed_back(
    autojump_clock: Any,
) -> None:
    registry, _, _ = blocking_registry(["q"])
    driver = SlowHandBack()
    a, b = await _enqueue(registry, driver, ["a", "b"])
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=2.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await driver.handing_back.wait()  # b at its hold limit, its hand-back being written
        w.accept("SIGTERM")
        w.bind(trio.current_time() + 25)
        await trio.testing.wait_all_tasks_blocked()
        assert w.state is WorkerState.DRAINING  # the teardown waits for the hand-back
        driver.gate.set()
        await w.stop()
    for job_id, error in ((a, "X_DRAINING"), (b, "X_HANDED_BACK")):  # first reason kept
        r = await record(driver, job_id)
        assert (r.state, r.attempts) == (JobState.READY, 0)
        assert r.last_error is not None and error in r.last_error
    assert w.stats().abandoned == ()
    assert w.stats().interrupted == 2


@pytest.mark.parametrize("bad", [-1, 1.5, True, {"q": -2}, {"Q": 4}])
def test_claim_ahead_refuses_what_is_not_a_count(bad: Any) -> None:
    registry, _, _ = blocking_registry(["q"])
    with pytest.raises(ConfigError, match="claim_ahead"):
        worker(CountingDriver(), registry, claim_ahead=bad)


async def test_a_stalled_database_at_sigterm_names_every_held_job_it_could_not_hand_back(
    autojump_clock: Any,
) -> None:
    # The hand-backs are settlements like any other: with the database stalled they wait under
    # the budget, and at its end each held job is named (exit non-zero), never dropped silently.
    registry = Registry()
    first_started = trio.Event()

    @registry.job("q.job", queue="q")
    async def job(ctx: JobContext, payload: str) -> None:
        first_started.set()
        await trio.sleep_forever()

    driver = FaultyDriver()
    ids = [await job.enqueue(driver, name, priority=i) for i, name in enumerate("abc")]
    w = worker(driver, registry, concurrency=1, claim_ahead=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await first_started.wait()
        await trio.testing.wait_all_tasks_blocked()
        driver.settles_open = trio.Event()  # every write from here waits: a stalled server
        t0 = trio.current_time()
        w.accept("SIGTERM")
        w.bind(t0 + 2)
        await w.stop()
        assert trio.current_time() == t0 + 2  # the budget, not forever
    assert sorted(w.stats().abandoned) == sorted(ids)  # the running one and both held
    for job_id in ids:
        # Nothing was written: each lease lapses and the job runs again (at-least-once).
        assert (await record(driver, job_id)).state is JobState.RUNNING
