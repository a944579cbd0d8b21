# The fencing rule of a step recorded in the caller's transaction (`save_step(connection=tx)`,
# what step.transaction rests on), on every driver with transactions: the record commits with
# the transaction's writes or neither lands, a stale token writes nothing, and no claim takes the
# job over between the token's check and the commit. A driver without transactions refuses it
# (each test checks that instead: _with_transactions).
from __future__ import annotations

import pytest
import trio

import jobs_trio
from jobs_trio._core.errors import ConfigError
from jobs_trio._core.records import Claim, RenewResult, StepRecord, StepStatus
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import a_claim_taken_over, claim_one, enqueue_one, new_job

DONE = StepRecord("insert", StepStatus.DONE, started_at=1.0, finished_at=2.0, result='"ok"')


class _Undone(Exception):
    """Raised in a block to roll it back, as step.transaction does when its record is refused."""


async def _with_transactions(driver: Driver) -> bool:
    """Whether ``driver`` has transactions, and so the rule's tests run. For a driver without
    them the rule is a refusal (step.transaction is refused there too), checked instead: a
    record in a caller's transaction is a ConfigError that writes nothing, never a write that
    would commit apart from the effects it was meant to commit with."""
    if callable(getattr(driver, "open_transaction", None)):
        return True
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    with pytest.raises(ConfigError):
        await driver.save_step(claim.lease, DONE, connection=object())
    assert await driver.load_steps(job_id) == []
    return False


async def _step_with_an_effect(driver: Driver, claim: Claim) -> tuple[bool, str]:
    """One step's transaction: an effect (a job enqueued in it), then the fenced record; rolled
    back when the record is refused. Answers whether it was recorded, and the effect's id."""
    try:
        async with jobs_trio.transaction(driver) as tx:
            [effect] = await driver.enqueue([new_job(queue="effects")], connection=tx)
            if not await driver.save_step(claim.lease, DONE, connection=tx):
                raise _Undone
    except _Undone:
        return False, effect.job_id
    return True, effect.job_id


async def test_a_step_recorded_in_a_transaction_commits_with_its_writes(driver: Driver) -> None:
    if not await _with_transactions(driver):
        return
    job_id = await enqueue_one(driver)
    recorded, effect = await _step_with_an_effect(driver, await claim_one(driver))
    assert recorded
    assert await driver.load_steps(job_id) == [DONE]
    assert await driver.get(effect) is not None


async def test_a_step_recorded_in_a_transaction_that_rolls_back_is_not_recorded(
    driver: Driver,
) -> None:
    if not await _with_transactions(driver):
        return
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    with pytest.raises(_Undone):
        async with jobs_trio.transaction(driver) as tx:
            [effect] = await driver.enqueue([new_job(queue="effects")], connection=tx)
            assert await driver.save_step(claim.lease, DONE, connection=tx)
            raise _Undone
    assert await driver.load_steps(job_id) == []
    assert await driver.get(effect.job_id) is None


async def test_a_stale_token_records_nothing_and_its_writes_roll_back(
    driver: Driver, manual_clock: ManualClock
) -> None:
    if not await _with_transactions(driver):
        return
    job_id, stale, current = await a_claim_taken_over(driver, manual_clock)
    recorded, effect = await _step_with_an_effect(driver, stale)
    assert not recorded
    assert await driver.load_steps(job_id) == []
    assert await driver.get(effect) is None
    # The worker that holds the job now records the same step, once.
    recorded, effect = await _step_with_an_effect(driver, current)
    assert recorded and await driver.get(effect) is not None
    assert await driver.load_steps(job_id) == [DONE]


async def test_no_claim_takes_the_job_over_between_the_check_and_the_commit(
    driver: Driver, manual_clock: ManualClock
) -> None:
    if not await _with_transactions(driver):
        return
    job_id = await enqueue_one(driver)
    first = await claim_one(driver, lease=10)
    answers: list[tuple[list[str], bool]] = []
    answered = trio.Event()
    committed = False

    async def take_over() -> None:
        claims = await driver.claim(["default"], 1, lease=10, worker_id="w2")
        answers.append(([c.job_id for c in claims], committed))
        answered.set()

    async with trio.open_nursery() as nursery:
        async with jobs_trio.transaction(driver) as tx:
            assert await driver.save_step(first.lease, DONE, connection=tx)
            manual_clock.advance(11)  # the lease has lapsed: a claim may take the job now...
            nursery.start_soon(take_over)
            # ...but not before this commits: it skips the job (PostgreSQL: the row is locked)
            # or waits for the block (SQLite: one writer). Waiting longer proves no more.
            with trio.move_on_after(2):
                await answered.wait()
        committed = True
    [(taken, after_commit)] = answers
    assert taken == [] or after_commit, "a claim took the job while its step was committing"
    if not taken:
        taken = [(await claim_one(driver)).job_id]
    # Whoever holds the job now replays the step: its record committed before the claim.
    assert taken == [job_id]
    assert await driver.load_steps(job_id) == [DONE]


async def test_a_renewal_during_a_steps_transaction_extends_the_lease(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # The run renews its lease while its step commits (a job of many short steps is nearly
    # always inside one): the fence's lock must hold off claims, not the run's own renewal.
    # PostgreSQL answers at once (a renewal skips a row locked against it: `busy`, its lease
    # not extended, and a few of those in a row stopped the run); SQLite waits for the block.
    if not await _with_transactions(driver):
        return
    await enqueue_one(driver)
    claim = await claim_one(driver, lease=10)
    renewals: list[RenewResult] = []
    answered = trio.Event()

    async def renew() -> None:
        renewals.append(await driver.renew([claim.lease], lease=10))
        answered.set()

    async with trio.open_nursery() as nursery, jobs_trio.transaction(driver) as tx:
        assert await driver.save_step(claim.lease, DONE, connection=tx)
        manual_clock.advance(5)
        nursery.start_soon(renew)
        with trio.move_on_after(2):  # answered at once, or (SQLite) after the block
            await answered.wait()
    [renewed] = renewals
    assert renewed.held == {claim.token} and not renewed.busy
    manual_clock.advance(9)  # past the first lease: still held, by the renewal
    assert await driver.claim(["default"], 1, lease=10, worker_id="w2") == []
