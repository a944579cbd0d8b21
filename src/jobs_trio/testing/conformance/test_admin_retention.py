# Retention (issue 16): prune deletes finished jobs past their age and nothing else, in bounded
# batches, one pruner at a time; every driver alike, every state walked.
from __future__ import annotations

from jobs_trio._core.records import Complete, Pruned, PruneTurn, StepRecord, StepStatus
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, enqueue_one
from .job_states import STATES, place

DAY = 86_400.0
# Every state, placed so that no placement's claim takes an earlier one's job: the one whose
# claim buries a lapsed job first, running ones before their leases could lapse, never-claimed
# ones last.
PLACING_ORDER = (
    "dead-lapsed-cancel-requested",
    "ready-retry-delay",
    "suspended-time",
    "suspended-event",
    "parked",
    "completed",
    "dead",
    "running",
    "running-cancel-requested",
    "ready-due",
    "ready-delayed",
    "cancelled",
)
assert sorted(PLACING_ORDER) == sorted(STATES)


async def completed_past_their_keep(driver: Driver, clock: ManualClock, count: int) -> None:
    """``count`` completed jobs, then the clock moved past the finished jobs' keep (a day)."""
    for _ in range(count):
        await place(driver, clock, "completed")
    clock.advance(2 * DAY)


def turn(holder: str = "w1", **kw: object) -> PruneTurn:
    options: dict[str, object] = {"keep_finished": DAY, "keep_dead": 7 * DAY} | kw
    return PruneTurn(holder, **options)  # type: ignore[arg-type]


async def test_prune_deletes_finished_jobs_past_their_age_and_keeps_every_live_one(
    driver: Driver, manual_clock: ManualClock
) -> None:
    placed = {state: await place(driver, manual_clock, state) for state in PLACING_ORDER}
    manual_clock.advance(2 * DAY)  # finished ones are past keep_finished, dead ones are not
    pruned = await driver.prune(turn())
    assert (pruned.turn, pruned.deleted, pruned.more) == (True, 2, False)
    gone = {s for s, p in placed.items() if await driver.get(p.job_id) is None}
    assert gone == {"completed", "cancelled"}

    manual_clock.advance(6 * DAY)  # now the dead ones are past keep_dead too
    assert (await driver.prune(turn())).deleted == 2
    gone = {s for s, p in placed.items() if await driver.get(p.job_id) is None}
    assert gone == {"completed", "cancelled", "dead", "dead-lapsed-cancel-requested"}
    # Ready, running, suspended, parked: never deleted, however old.
    assert len(await driver.list_jobs(limit=100)) == len(STATES) - 4


async def test_a_finished_job_younger_than_its_age_is_kept(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await place(driver, manual_clock, "completed")
    manual_clock.advance(DAY - 10)
    assert (await driver.prune(turn())).deleted == 0
    manual_clock.advance(20)
    assert (await driver.prune(turn())).deleted == 1


async def test_keep_dead_none_keeps_dead_jobs_forever(
    driver: Driver, manual_clock: ManualClock
) -> None:
    dead = await place(driver, manual_clock, "dead")
    manual_clock.advance(3650 * DAY)
    assert (await driver.prune(turn(keep_dead=None))).deleted == 0
    assert await driver.get(dead.job_id) is not None


async def test_a_dead_job_re_run_by_an_operator_is_live_again_and_kept(
    driver: Driver, manual_clock: ManualClock
) -> None:
    dead = await place(driver, manual_clock, "dead")
    manual_clock.advance(30 * DAY)
    await driver.retry(dead.job_id)
    assert (await driver.prune(turn())).deleted == 0
    assert await driver.get(dead.job_id) is not None


async def test_a_pruned_job_takes_its_step_records_with_it(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    now = driver.now()
    step = StepRecord("charge", StepStatus.DONE, now, finished_at=now, result='"ok"')
    assert await driver.save_step(claim.lease, step)
    assert await driver.settle([Complete(claim.lease, '"done"')]) == [job_id]
    manual_clock.advance(2 * DAY)
    assert (await driver.prune(turn())).deleted == 1
    assert await driver.load_steps(job_id) == []


async def test_batches_are_bounded_and_one_pruner_holds_the_turn_between_them(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await completed_past_their_keep(driver, manual_clock, 5)
    first = await driver.prune(turn("w1", limit=2, hold=60.0))
    assert (first.turn, first.deleted, first.more) == (True, 2, True)
    # w1 holds the turn between its batches: w2 deletes nothing, even asking with every=0.
    assert await driver.prune(turn("w2", limit=2)) == Pruned(turn=False)
    assert (await driver.prune(turn("w1", limit=2))).deleted == 2
    last = await driver.prune(turn("w1", limit=2))
    assert (last.deleted, last.more) == (1, False)  # not full: the turn ends
    assert len(await driver.list_jobs(limit=10)) == 0


async def test_a_turn_whose_holder_went_away_frees_after_its_hold(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await completed_past_their_keep(driver, manual_clock, 3)
    assert (await driver.prune(turn("w1", limit=1, hold=60.0))).more
    manual_clock.advance(59)
    assert not (await driver.prune(turn("w2", limit=1))).turn
    manual_clock.advance(2)  # w1 has not come back within its hold: w2 may take the turn
    assert (await driver.prune(turn("w2", limit=1))).deleted == 1


async def test_a_turn_is_taken_only_every_so_often_across_the_fleet(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await completed_past_their_keep(driver, manual_clock, 1)
    assert (await driver.prune(turn("w1", every=300.0))).deleted == 1  # the turn ends here
    manual_clock.advance(100)
    # Another worker's tick within `every` of the last turn's end: no turn.
    assert await driver.prune(turn("w2", every=300.0)) == Pruned(turn=False)
    manual_clock.advance(200)
    assert await driver.prune(turn("w2", every=300.0)) == Pruned(turn=True)
