from __future__ import annotations

from jobs_trio._core.records import (
    AttemptNote,
    CancelJob,
    Complete,
    DeadLetter,
    JobState,
    Lease,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import a_claim_taken_over, claim_one, enqueue_one, new_job


async def test_complete_stores_the_result(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    assert await driver.settle([Complete(claim.lease, result='{"ok": 1}')]) == [job_id]
    record = await driver.get(job_id)
    assert record is not None
    # The value the stored JSON stands for (issue 46: it came back as the JSON text).
    assert record.state is JobState.COMPLETED and record.result == {"ok": 1}
    assert record.attempts == 1


async def test_retry_counted_waits_its_delay_and_keeps_the_attempt(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.settle([Retry(claim.lease, delay=30, error="boom")])
    record = await driver.get(job_id)
    assert record is not None
    assert record.state is JobState.READY and record.attempts == 1 and record.last_error == "boom"
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []
    manual_clock.advance(30)
    assert (await claim_one(driver)).attempt == 2


async def test_retry_not_counted_hands_the_attempt_back_and_is_ready_now(driver: Driver) -> None:
    job_id = await enqueue_one(driver, attempts=1)
    claim = await claim_one(driver)
    await driver.settle(
        [Retry(claim.lease, delay=0, error="interrupted: draining", hands_back=True)]
    )
    record = await driver.get(job_id)
    assert record is not None
    assert record.state is JobState.READY and record.attempts == 0
    assert record.last_error == "interrupted: draining"
    again = await claim_one(driver)
    assert again.attempt == 1  # a job with one attempt survives a deploy


async def test_an_interrupted_attempt_keeps_its_place_in_line(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # Drained (handed back at once, uncounted), a job that was running goes back ahead of the
    # jobs that waited behind it: given a run_at of now, a deploy put it behind them all.
    first = await enqueue_one(driver)
    manual_clock.advance(1)
    second = await enqueue_one(driver)
    claim = await claim_one(driver)
    assert claim.job_id == first
    manual_clock.advance(1)
    await driver.settle(
        [Retry(claim.lease, delay=0, error="interrupted: draining", hands_back=True)]
    )
    assert (await claim_one(driver)).job_id == first
    # A counted retry, or one handed back with a delay, goes where its delay puts it.
    [again] = await driver.claim(["default"], 1, lease=30, worker_id="w")
    assert again.job_id == second
    manual_clock.advance(1)
    await driver.settle([Retry(again.lease, delay=0, error="boom")])
    record = await driver.get(second)
    assert record is not None and record.run_at == driver.now()


async def test_dead_letter_park_and_cancel(driver: Driver) -> None:
    ids = [a.job_id for a in await driver.enqueue([new_job() for _ in range(3)])]
    claims = {c.job_id: c for c in await driver.claim(["default"], 3, lease=30, worker_id="w")}
    applied = await driver.settle(
        [
            DeadLetter(claims[ids[0]].lease, error="bad"),
            Park(claims[ids[1]].lease, reason="unknown job name"),
            CancelJob(claims[ids[2]].lease, error="cancelled by an operator"),
        ]
    )
    assert sorted(applied) == sorted(ids)
    states = {i: (await driver.get(i)) for i in ids}
    assert states[ids[0]].state is JobState.DEAD and states[ids[0]].last_error == "bad"  # type: ignore[union-attr]
    assert states[ids[1]].state is JobState.PARKED and states[ids[1]].attempts == 0  # type: ignore[union-attr]
    assert states[ids[2]].state is JobState.CANCELLED  # type: ignore[union-attr]


async def test_suspend_hands_the_attempt_back_and_resumes_after_the_delay(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.settle([Suspend(claim.lease, delay=100)])
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.SUSPENDED and record.attempts == 0
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []
    manual_clock.advance(100)
    assert (await claim_one(driver)).attempt == 1


async def test_batch_settle_of_many_completes(driver: Driver) -> None:
    await driver.enqueue([new_job() for _ in range(20)])
    claims = await driver.claim(["default"], 20, lease=30, worker_id="w")
    applied = await driver.settle([Complete(c.lease) for c in claims])
    assert sorted(applied) == sorted(c.job_id for c in claims)
    assert len(await driver.list_jobs(state=JobState.COMPLETED)) == 20


async def test_a_mixed_batch_settles_each_as_alone(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # One settle call of completions (with results and notes, one of them stale), a retry and
    # a dead-letter, each job once: each written as it would be alone, the applied ids in the
    # call's order, the stale one changing nothing, and every note in its job's history.
    [lapsed] = [e.job_id for e in await driver.enqueue([new_job()])]
    stale = await claim_one(driver, lease=10)
    manual_clock.advance(11)
    ids = [e.job_id for e in await driver.enqueue([new_job() for _ in range(5)])]
    claims = {c.job_id: c for c in await driver.claim(["default"], 6, lease=30, worker_id="w")}
    assert set(claims) == {lapsed, *ids}
    note = AttemptNote(attempt=1, worker_id="w", seconds=0.5)
    batch: list[Settlement] = [
        Complete(claims[ids[0]].lease, result='{"n": 0}', note=note),
        Retry(claims[ids[1]].lease, delay=60, error="again", note=note),
        Complete(stale.lease, result='"stale"', note=note),
        Complete(claims[ids[2]].lease, note=note),
        DeadLetter(claims[ids[3]].lease, error="gone", note=note),
        Complete(claims[ids[4]].lease, result="[1, 2]"),
    ]
    assert await driver.settle(batch) == [ids[0], ids[1], ids[2], ids[3], ids[4]]
    found = {i: await driver.get(i) for i in [lapsed, *ids]}
    assert {i: (r.state, r.result) for i, r in found.items() if r is not None} == {
        lapsed: (JobState.RUNNING, None),  # its current claim's, untouched
        ids[0]: (JobState.COMPLETED, {"n": 0}),
        ids[1]: (JobState.READY, None),
        ids[2]: (JobState.COMPLETED, None),
        ids[3]: (JobState.DEAD, None),
        ids[4]: (JobState.COMPLETED, [1, 2]),
    }
    for job_id in ids[:4]:
        [entry] = await driver.load_attempts(job_id)
        assert (entry.attempt, entry.worker_id, entry.seconds) == (1, "w", 0.5)
    assert await driver.load_attempts(ids[4]) == []  # no note, no history
    # The stale settlement wrote nothing: the lapsed job's history holds at most its
    # orphaning, recorded by the claim that found it lapsed (rules.orphaned_record).
    outcomes = [entry.outcome for entry in await driver.load_attempts(lapsed)]
    assert outcomes == (["orphaned"] if driver.capabilities.claims_alone else [])


async def test_settle_with_a_stale_token_changes_nothing(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id, stale, current = await a_claim_taken_over(driver, manual_clock)
    before = await driver.get(job_id)
    assert await driver.settle([Complete(stale.lease, result="1")]) == []
    assert await driver.settle([DeadLetter(stale.lease, error="x")]) == []
    after = await driver.get(job_id)
    assert after is not None and before is not None
    assert after.state is JobState.RUNNING and after.attempts == before.attempts
    assert await driver.settle([Complete(current.lease)]) == [job_id]


async def test_settle_twice_applies_once(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    assert await driver.settle([Complete(claim.lease)]) == [job_id]
    assert await driver.settle([Retry(claim.lease, delay=0, error="late")]) == []
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.COMPLETED


async def test_renew_extends_held_leases_and_refuses_stale_ones(
    driver: Driver, manual_clock: ManualClock
) -> None:
    a = await enqueue_one(driver)
    b = await enqueue_one(driver)
    claims = {c.job_id: c for c in await driver.claim(["default"], 2, lease=10, worker_id="w")}
    manual_clock.advance(8)
    result = await driver.renew([claims[a].lease, claims[b].lease], lease=10)
    assert result.held == {claims[a].token, claims[b].token}
    manual_clock.advance(8)  # past the first lease, within the renewed one
    assert await driver.claim(["default"], 2, lease=10, worker_id="other") == []
    bogus = Lease(a, "not-the-token")
    assert (await driver.renew([bogus], lease=10)).held == frozenset()


async def test_renew_after_another_worker_took_over_is_refused(
    driver: Driver, manual_clock: ManualClock
) -> None:
    _, first, second = await a_claim_taken_over(driver, manual_clock)
    # Both runs' leases in one call, as a worker that re-claimed its own lapsed job sends
    # them: only the newer token reads as held, though both name the same job.
    result = await driver.renew([first.lease, second.lease], lease=10)
    assert result.held == {second.token}
