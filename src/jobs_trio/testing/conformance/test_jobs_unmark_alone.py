# A suspect's run abandoned at a drain's grace (Capabilities.unmarks_alone): its worker clears the
# alone mark, so the lapse orphans it instead of dead-lettering it, and nothing else changes.
from __future__ import annotations

from typing import cast

import pytest

from jobs_trio._core.records import Claim, JobState, Lease, OutcomeKind, new_token
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import KILLED_WORKER_ERROR, ORPHANED_ERROR, SUSPECT_AT
from jobs_trio.drivers.contract import UnmarksAlone
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one, needs_claims_alone
from .test_jobs_orphans import _make_suspect


def _unmarking(driver: Driver) -> UnmarksAlone:
    needs_claims_alone(driver)
    if not driver.capabilities.unmarks_alone:
        pytest.skip("the driver does not declare unmarks_alone")
    return cast(UnmarksAlone, driver)


async def _suspect_alone(driver: Driver, clock: ManualClock) -> Claim:
    """A suspect of "q", claimed alone by "drained"."""
    job_id = await enqueue_one(driver, queue="q", attempts=3)
    await _make_suspect(driver, clock)
    [alone] = await driver.claim(["q"], 1, lease=10, worker_id="drained", alone=True)
    assert alone.job_id == job_id and alone.alone
    return alone


async def test_an_unmarked_suspect_is_orphaned_at_its_lapse_not_dead_lettered(
    driver: Driver, manual_clock: ManualClock
) -> None:
    unmarking = _unmarking(driver)
    alone = await _suspect_alone(driver, manual_clock)

    assert list(await unmarking.unmark_alone([alone.lease])) == [alone.job_id]

    # Nothing else changed: still running under its lease, which nobody may take early (the
    # abandoned body may still run until its process exits).
    manual_clock.advance(9)
    assert await driver.claim(["q"], 5, lease=10, worker_id="early", alone=True) == []
    record = await driver.get(alone.job_id)
    assert record is not None and record.state is JobState.RUNNING
    assert record.worker_id == "drained" and record.attempts == 1
    manual_clock.advance(2)
    # Its lease lapsed: orphaned, its attempt handed back, a suspect still (claimed alone).
    assert await driver.claim(["q"], 5, lease=10, worker_id="busy") == []
    record = await driver.get(alone.job_id)
    assert record is not None and record.state is JobState.READY
    assert record.orphans == SUSPECT_AT + 1 and record.attempts == 0
    assert record.last_error == ORPHANED_ERROR.format(orphans=SUSPECT_AT + 1)
    history = await driver.load_attempts(alone.job_id)
    assert [h.outcome for h in history] == [OutcomeKind.ORPHANED.value] * (SUSPECT_AT + 1)
    assert history[-1].worker_id == "drained"
    [again] = await driver.claim(["q"], 5, lease=10, worker_id="idle", alone=True)
    assert again.job_id == alone.job_id and again.alone and again.attempt == 1
    # Claimed again: the abandoned run's lease no longer unmarks anything, and the new run's
    # lapse is its own doing.
    assert list(await unmarking.unmark_alone([alone.lease])) == []
    manual_clock.advance(11)
    assert await driver.claim(["q"], 5, lease=10, worker_id="rescuer") == []
    dead = await driver.get(alone.job_id)
    assert dead is not None and dead.state is JobState.DEAD
    assert dead.last_error == KILLED_WORKER_ERROR


async def test_a_stale_or_wrong_token_unmarks_nothing(
    driver: Driver, manual_clock: ManualClock
) -> None:
    unmarking = _unmarking(driver)
    alone = await _suspect_alone(driver, manual_clock)

    wrong = Lease(alone.job_id, new_token())
    assert list(await unmarking.unmark_alone([wrong])) == []

    # Still alone: its lapse is its own doing, as without the call.
    manual_clock.advance(11)
    assert await driver.claim(["q"], 5, lease=10, worker_id="rescuer") == []
    record = await driver.get(alone.job_id)
    assert record is not None and record.state is JobState.DEAD
    assert record.last_error == KILLED_WORKER_ERROR
    # Its run has ended: the lease it ran under unmarks nothing now either.
    assert list(await unmarking.unmark_alone([alone.lease])) == []
    dead = await driver.get(alone.job_id)
    assert dead is not None and dead.state is JobState.DEAD and dead.orphans == record.orphans
