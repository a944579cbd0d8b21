# A worker whose every connection is TLS (sslmode=require through tests/tls_front): the asyncio
# loop reads those connections, not our tasks (drivers/direct_reads), so the claim, the settle,
# the LISTEN wake-up, the drain and the reconnect each take a path the plain tests never do.
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import Complete, JobState
from jobs_trio.drivers._direct_reads import transport_of
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers.postgres import open_postgres_driver
from jobs_trio.testing.conformance.helpers import new_job
from tests.apps.postgres_app import registry
from tests.drivers.test_postgres_driver import open_admin
from tests.drivers.test_processes_postgres import (
    assert_each_ran_once,
    body_started,
    completed_by_the_second,
    completed_in,
    fresh_database,
    kill_driver_backends,
    lines_of,
    still_running,
    stop,
    until,
    workers,
)
from tests.helpers.tls_front import tls_front

pytestmark = [pytest.mark.postgres]

pytest.importorskip("asyncpg")
pytest.importorskip("trustme")


async def test_the_driver_claims_settles_and_is_woken_over_tls(
    postgres_url: str, pg_schema: str
) -> None:
    async with (
        tls_front(postgres_url) as front,
        open_postgres_driver(
            front.url, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ) as driver,
    ):

        async def look(conn: object) -> bool:
            return _is_tls(conn)

        # The connection is TLS, and the loop's to read: what this test is for.
        assert await driver.bridge.run(look, what="look") is True
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                # The wait's own timeout (60 s) would be a missed wake-up, not a NOTIFY heard.
                # Not cancelling the nursery once woken: the NOTIFY can wake it before the
                # enqueue's own answer is read, and that read must not be cut.
                with trio.fail_after(20):
                    await driver.wait_for_work(["tls"], timeout=60)

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            # Hostile text both ways through TLS: a NUL escape, a lone surrogate's escape.
            [enqueued] = await driver.enqueue([new_job(queue="tls", payload="\x00 \ud800 x")])
        job_id = enqueued.job_id
        [claim] = await driver.claim(["tls"], 1, lease=30, worker_id="w")
        assert claim.job_id == job_id
        assert json.loads(claim.payload) == "\x00 \ud800 x"
        result = json.dumps({"echo": json.loads(claim.payload)})
        assert await driver.settle([Complete(claim.lease, result)]) == [job_id]
        done = await driver.get(job_id)
        assert (
            done is not None
            and done.state is JobState.COMPLETED
            and done.result == json.loads(result)
        )
    assert front.plain == 0
    assert front.tls >= 2  # the pool's connection and the LISTEN one


def _is_tls(conn: object) -> bool:
    transport = getattr(conn, "_transport", None)
    return (
        transport is not None
        and transport_of(conn) is None
        and (transport.get_extra_info("ssl_object") is not None)
    )


@pytest.mark.slow
async def test_a_worker_process_over_tls_runs_each_job_once_and_drains_on_sigterm(
    tmp_path: Path, postgres_url: str
) -> None:
    seen = tmp_path / "seen.txt"
    count = 1_000
    async with (
        fresh_database(postgres_url) as url,
        tls_front(url) as front,
        open_driver(url) as driver,
    ):
        ids = await registry.require("app.record").enqueue_many(
            driver, [{"seen": str(seen)}] * count
        )
        hang = await registry.require("app.hang").enqueue(driver, {"seconds": 60})
        async with workers(tmp_path, front.url, 1, "--concurrency", "20") as [first]:

            async def all_completed() -> bool:
                return still_running(first) and await completed_in(driver, "bulk") == count

            await until(f"{count:,} jobs completed over TLS", 60, all_completed)
            await body_started(driver, hang)
            signalled = trio.current_time()
            first.signal(signal.SIGTERM)
            assert await first.exit_code(within=30) == 0, first.output()
            # The drain reaches the body at once over TLS too: no grace period waited out.
            assert trio.current_time() - signalled < 5, first.output()
        drained = await driver.get(hang)
        assert drained is not None and (drained.state, drained.attempts) == (JobState.READY, 0)
        async with workers(tmp_path, front.url, 1) as [second]:
            await completed_by_the_second(driver, hang)
            await stop([second])
        done = await driver.get(hang)
        assert done is not None and done.attempts == 1  # the drained run handed its attempt back
        assert done.result == {"attempt": 1}
    assert_each_ran_once(seen, ids)
    assert front.plain == 0
    assert front.tls >= 4  # each worker's pool and LISTEN connections


@pytest.mark.slow
async def test_a_worker_over_tls_whose_connections_are_killed_reconnects_and_loses_nothing(
    tmp_path: Path, postgres_url: str
) -> None:
    seen = tmp_path / "seen.txt"
    count = 1_000
    async with fresh_database(postgres_url) as url, tls_front(url) as front:
        async with open_driver(url) as driver:
            # 50 ms jobs at concurrency 20: a stream of at least 2.5 s to disturb.
            ids = await registry.require("app.record").enqueue_many(
                driver, [{"seen": str(seen), "pause": 0.05}] * count
            )
        async with (
            open_admin(url) as admin,
            workers(tmp_path, front.url, 1, "--concurrency", "20", "--lease", "10") as [worker],
        ):

            async def some_ran() -> bool:
                return still_running(worker) and len(lines_of(seen)) >= 200

            await until("200 jobs run", 30, some_ran)
            before = front.tls
            killed = await kill_driver_backends(admin)
            assert {name.rsplit(":", 1)[1] for name in killed} == {"pool", "listen"}, killed

            async def reconnected() -> bool:
                return still_running(worker) and "jobs.driver.reconnected" in worker.output()

            await until("the LISTEN connection to reconnect over TLS", 20, reconnected)
            async with open_driver(url) as driver:

                async def all_completed() -> bool:
                    return still_running(worker) and await completed_in(driver, "bulk") == count

                await until(f"{count:,} jobs completed", 60, all_completed)
            await stop([worker])
        assert front.tls > before  # new connections, each through TLS again
    assert_each_ran_once(seen, ids)
    assert front.plain == 0
