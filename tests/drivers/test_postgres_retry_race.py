# A hand retry that races an enqueue of the same unique key on PostgreSQL: the driver's look
# for a live holder cannot see a transaction not yet committed; the unique index then decides.
# Apart from the conformance tables because only PostgreSQL has a second writer mid-retry.
from __future__ import annotations

import pytest
import trio

from jobs_trio._core.errors import InvalidTransition
from jobs_trio._core.records import DeadLetter, JobState
from jobs_trio.testing.conformance.helpers import new_job
from tests.conftest import require_postgres

pytestmark = pytest.mark.postgres

trio_asyncio = pytest.importorskip("trio_asyncio")

from jobs_trio.drivers.postgres import open_postgres_driver  # noqa: E402
from tests.drivers.test_postgres_driver import eventually, open_admin  # noqa: E402


@pytest.mark.parametrize("other_commits", [True, False], ids=["commits", "rolls-back"])
async def test_a_retry_racing_an_enqueue_of_its_key_is_decided_by_the_index(
    pg_schema: str, other_commits: bool
) -> None:
    url = require_postgres()
    async with (
        trio_asyncio.open_loop(),
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, lock_timeout=10
        ) as driver,
        open_admin(url) as app,
    ):
        [dead] = await driver.enqueue([new_job(key="k")])
        [claim] = await driver.claim(["default"], 1, lease=30, worker_id="w")
        await driver.settle([DeadLetter(claim.lease, "fatal")])
        # The application's transaction takes the freed key, and has not committed yet.
        await app.execute("BEGIN")
        [other] = await driver.enqueue([new_job(key="k")], connection=app.conn)
        assert other.created
        outcome: list[object] = []

        async def retry() -> None:
            try:
                outcome.append(await driver.retry(dead.job_id))
            except InvalidTransition as exc:
                outcome.append(exc)

        async def retry_waits_on_the_index() -> bool:
            # Someone waits for the application's own transaction: the retry, on the index
            # entry of the key (other tests on the server wait on other transactions).
            waiting = await app.fetchval(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
                " AND transactionid::text::bigint = txid_current() % 4294967296"
            )
            return bool(waiting)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(retry)
                await eventually(retry_waits_on_the_index)
                await app.execute("COMMIT" if other_commits else "ROLLBACK")
        [answer] = outcome
        record = await driver.get(dead.job_id)
        assert record is not None
        if other_commits:
            # The same refusal as the look's, and the dead job untouched.
            assert isinstance(answer, InvalidTransition)
            assert "held by another live job" in str(answer)
            assert record.state is JobState.DEAD and record.last_error == "fatal"
        else:
            assert not isinstance(answer, InvalidTransition)
            assert record.state is JobState.READY and record.attempts == 0
