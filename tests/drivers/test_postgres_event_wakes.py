# No lost wake-up on PostgreSQL (issue 45), each ordering of a send and a job's suspend made by
# hand: a send in the application's transaction that commits after the suspend, a send whose
# transaction holds an id below one the look saw, a suspend settled while a send commits. Apart
# from the conformance suite because these orderings exist only where writers do not serialize
# (memory and SQLite have one writer at a time).
from __future__ import annotations

import pytest

from jobs_trio._core.records import JobState, Suspend
from jobs_trio.driver import Driver
from jobs_trio.testing.conformance.helpers import claim_one, enqueue_one
from tests.drivers.test_postgres_driver import driver_and_admin, url  # noqa: F401 (a fixture)

pytestmark = pytest.mark.postgres

trio_asyncio = pytest.importorskip("trio_asyncio")

POLL = 3600.0  # the job's event_poll: a missed wake-up leaves it asleep an hour


async def _looked_and_suspended(driver: Driver, key: str) -> tuple[str, Suspend]:
    """A job claimed, its look for ("shipped", key) done and empty: its suspension, unsettled.
    In a queue of its own (named for the key): no other test job is claimed instead."""
    job_id = await enqueue_one(driver, queue=key)
    claim = await claim_one(driver, queue=key)
    assert claim.job_id == job_id
    look = await driver.look_for_event("shipped", key=key, since=None)
    assert look.found is None
    return job_id, Suspend(claim.lease, POLL, event="shipped", seen=look.seen, match=key)


async def _state(driver: Driver, job_id: str) -> JobState:
    record = await driver.get(job_id)
    assert record is not None
    return record.state


async def test_a_send_in_a_transaction_that_commits_after_the_suspend_wakes_the_job(
    url: str,  # noqa: F811
    pg_schema: str,
) -> None:
    async with trio_asyncio.open_loop(), driver_and_admin(url, pg_schema) as (driver, app):
        job_id, suspend = await _looked_and_suspended(driver, "order-7")
        await app.execute("BEGIN")
        await driver.send_event("shipped", "{}", key="order-7", connection=app.conn)
        # The send is not committed: the settle cannot see it, and it finds the job running.
        assert await driver.settle([suspend]) == [job_id]
        assert await _state(driver, job_id) is JobState.SUSPENDED
        await app.execute("COMMIT")  # ... and wakes it as it commits
        assert await _state(driver, job_id) is JobState.READY
        # Rolled back, a send wakes nobody.
        job_id, suspend = await _looked_and_suspended(driver, "order-8")
        await app.execute("BEGIN")
        await driver.send_event("shipped", "{}", key="order-8", connection=app.conn)
        await driver.settle([suspend])
        await app.execute("ROLLBACK")
        assert await _state(driver, job_id) is JobState.SUSPENDED


async def test_an_event_committed_after_the_look_under_a_lower_id_wakes_the_job(
    url: str,  # noqa: F811
    pg_schema: str,
) -> None:
    async with trio_asyncio.open_loop(), driver_and_admin(url, pg_schema) as (driver, app):
        await app.execute("BEGIN")
        # Its id is taken now; its transaction commits only after the job looked.
        await driver.send_event("shipped", "{}", key="order-7", connection=app.conn)
        await driver.send_event("shipped", "{}", key="order-1")  # a higher id, committed first
        job_id, suspend = await _looked_and_suspended(driver, "order-7")
        await app.execute("COMMIT")  # the job still runs: its send wakes nothing
        assert await _state(driver, job_id) is JobState.RUNNING
        assert await driver.settle([suspend]) == [job_id]
        record = await driver.get(job_id)
        assert record is not None
        assert record.state is JobState.READY and record.run_at <= driver.now()


async def test_a_suspend_settled_while_a_send_of_its_key_commits_makes_the_job_ready(
    url: str,  # noqa: F811
    pg_schema: str,
) -> None:
    async with trio_asyncio.open_loop(), driver_and_admin(url, pg_schema) as (driver, app):
        job_id, suspend = await _looked_and_suspended(driver, "order-7")
        # What a send's trigger holds while it commits: the shared lock of the name and key.
        await app.execute("BEGIN")
        await app.execute(
            f'SELECT pg_advisory_xact_lock_shared("{pg_schema}".event_lock_key($1, $2))',
            "shipped",
            "order-7",
        )
        # The settle does not wait for it (it might wait on the settle in turn): ready now.
        assert await driver.settle([suspend]) == [job_id]
        assert await _state(driver, job_id) is JobState.READY
        # Another key's send committing holds another lock: that wait sleeps on.
        other_id, other = await _looked_and_suspended(driver, "order-8")
        assert await driver.settle([other]) == [other_id]
        assert await _state(driver, other_id) is JobState.SUSPENDED
        await app.execute("ROLLBACK")
