# Real `jobs-trio worker` processes through a real PgBouncer (Debian's package, started here),
# in each supported mode (issue 20): jobs enqueued, claimed, a running job drained on SIGTERM,
# and every job completed exactly once. Skipped where no `pgbouncer` binary is installed.
from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest

from jobs_trio._core.errors import ConfigError
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.postgres_app import registry
from tests.drivers.test_processes_postgres import (
    assert_each_ran_once,
    body_started,
    completed_by_the_second,
    completed_in,
    fresh_database,
    stop,
    workers,
)
from tests.helpers.pgbouncer_process import MISSING, PGBOUNCER, open_pgbouncer, through
from tests.helpers.process_helpers import assert_drained, started, until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@asynccontextmanager
async def a_pgbouncer(tmp_path: Path, server: str, mode: str) -> AsyncIterator[str]:
    """A PgBouncer in ``mode`` in front of ``server``; skipped where none is installed (failed
    under CI=true, where .ci/install-pgbouncer installs it)."""
    if PGBOUNCER is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {MISSING}")
        pytest.skip(MISSING)
    async with open_pgbouncer(tmp_path / f"pgbouncer-{mode}", server, mode) as bouncer:
        yield bouncer


MODES = {
    "session": "pgbouncer=session",
    "transaction, LISTEN direct": "pgbouncer=transaction&listen_port={direct_port}",
    "transaction, polling": "pgbouncer=transaction",
}


@pytest.mark.parametrize("mode", MODES)
async def test_workers_through_pgbouncer_run_each_job_once_and_drain(
    tmp_path: Path, postgres_url: str, mode: str
) -> None:
    seen = tmp_path / "seen.txt"
    pool_mode = mode.split(",")[0]
    query = MODES[mode].format(direct_port=urlparse(postgres_url).port or 5432)
    async with (
        fresh_database(postgres_url) as direct,
        a_pgbouncer(tmp_path, postgres_url, pool_mode) as bouncer,
    ):
        url = through(direct, bouncer, query)
        async with open_driver(url) as driver:
            hang_id = await registry.require("app.hang").enqueue(driver, {"seconds": 60})
            async with workers(tmp_path, url, 2, "--concurrency", "20") as procs:
                await started(procs)
                # Enqueued after the workers wait: they are woken (or poll) through the pooler.
                ids = await registry.require("app.record").enqueue_many(
                    driver, [{"seen": str(seen)}] * 500
                )

                async def all_completed() -> bool:
                    return await completed_in(driver, "bulk") == len(ids)

                await until("500 jobs completed through pgbouncer", 60, all_completed)
                await body_started(driver, hang_id)
                # Either may hold the hang job: both are drained, and each must exit 0.
                for proc in procs:
                    proc.signal(signal.SIGTERM)
                for proc in procs:
                    assert await proc.exit_code(within=15) == 0, proc.output()
            # Usually one holder. Both, when the other's claim was in flight as the drain began
            # and read the job the first had just handed back (polling through the pooler): it
            # then hands it back at once (interrupted after 0.00005 s), uncounted too.
            holders = [p for p in procs if "jobs.attempt.interrupted" in p.output()]
            assert holders, [p.output() for p in procs]
            for holder in holders:
                await assert_drained(driver, hang_id, holder)
            async with workers(tmp_path, url, 1) as [second]:
                await completed_by_the_second(driver, hang_id)
                await stop([second])
    assert_each_ran_once(seen, ids)


async def test_a_direct_connect_through_pgbouncer_says_to_name_the_mode(
    tmp_path: Path, postgres_url: str
) -> None:
    async with a_pgbouncer(tmp_path, postgres_url, "session") as bouncer:
        with pytest.raises(ConfigError) as refused:
            async with open_driver(through(postgres_url, bouncer, "")):
                pass
    assert "?pgbouncer=session" in refused.value.fix


async def test_the_blocking_producer_through_pgbouncer_in_transaction_mode_writes_every_job(
    tmp_path: Path, postgres_url: str
) -> None:
    # psycopg prepares a statement from its fifth use, on the server connection of that moment;
    # in transaction mode the next transaction may be on another, and about one write in seven
    # of a few threads failed ("prepared statement _pg3_... does not exist") (found by review).
    import threading

    from jobs_trio.sync import Producer

    async with (
        fresh_database(postgres_url) as direct,
        a_pgbouncer(tmp_path, postgres_url, "transaction") as bouncer,
    ):
        async with open_driver(direct, migrate=True):
            pass
        failures: list[BaseException] = []
        with Producer(through(direct, bouncer, "pgbouncer=transaction")) as producer:

            def write(n: int) -> None:
                for k in range(30):
                    try:
                        producer.enqueue(registry.require("app.record"), {"seen": f"{n}-{k}"})
                    except BaseException as exc:  # every failure counted, none hidden
                        failures.append(exc)

            threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert failures == []
        async with open_driver(direct) as driver:
            assert len(await driver.list_jobs(name="app.record", limit=1000)) == 120
