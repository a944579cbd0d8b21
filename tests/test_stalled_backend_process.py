# A real `jobs-trio worker` on PostgreSQL whose server stops answering altogether (its backends
# SIGSTOPped: not even a cancel request is served) at SIGTERM: the process is still gone within
# its grace, naming the job it could not settle.
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from jobs_trio.open_driver import open_driver
from tests.apps.drain_jobs_app import registry
from tests.process_helpers import started, until
from tests.test_drain_processes import body_started, exit_after_sigterm, workers

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


async def test_with_its_backends_stopped_the_worker_is_gone_within_its_grace(
    tmp_path: Path,
) -> None:
    from tests.conftest import require_postgres
    from tests.test_postgres_driver import open_admin
    from tests.test_processes_postgres import fresh_database

    path = tmp_path / "marks.txt"
    grace = 2.0
    async with fresh_database(require_postgres()) as url, open_driver(url) as driver:
        await registry.require("drain.wait").enqueue(driver, {"marks": str(path)})
        async with workers(tmp_path, url, 1, "--grace", str(grace)) as [worker]:
            await body_started(path)
            async with open_admin(url) as admin:
                # Every connection of the worker's: its pool's and its LISTEN one.
                pids: list[int] = await admin.fetchval(
                    "SELECT array_agg(pid) FROM pg_stat_activity WHERE datname ="
                    " current_database() AND application_name LIKE 'jobs_trio:%'"
                )
            assert pids
            stopped: list[int] = []
            try:
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                code, took = await exit_after_sigterm(worker, within=60)
            finally:
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
    print(f"\nexit {code} {took:.2f} s after SIGTERM with the backends stopped (grace {grace})")
    assert took < grace + 1.0, f"{took:.2f} s\n{worker.output()}"
    # The body unwound at the drain, but its hand-back could not be written: named, not lost
    # quietly (its lease lapses and it runs again elsewhere).
    assert code != 0, worker.output()
    assert "jobs.lifecycle.abandoned" in worker.output(), worker.output()


async def test_an_idle_worker_whose_backends_are_stopped_exits_within_its_grace(
    tmp_path: Path,
) -> None:
    # Nothing to settle, so no abandoned job ends the process early: it exits 0 through the
    # driver's close, which waited up to 5 s for each connection's end (the LISTEN one, then
    # the pool's) on a server that no longer answers: 10 s after a 1 s grace (a review).
    from tests.conftest import require_postgres
    from tests.test_postgres_driver import open_admin
    from tests.test_processes_postgres import fresh_database

    grace = 4.0
    async with (
        fresh_database(require_postgres()) as url,
        workers(tmp_path, url, 1, "--grace", str(grace)) as [worker],
    ):
        await started([worker])
        async with open_admin(url) as admin:

            async def both_connected() -> bool:
                names = await admin.fetchval(
                    "SELECT array_agg(application_name) FROM pg_stat_activity WHERE datname"
                    " = current_database() AND application_name LIKE 'jobs_trio:%'"
                )
                return {name.rsplit(":", 1)[1] for name in names or []} >= {"pool", "listen"}

            await until("the worker's pool and LISTEN connections", 20, both_connected)
            pids: list[int] = await admin.fetchval(
                "SELECT array_agg(pid) FROM pg_stat_activity WHERE datname ="
                " current_database() AND application_name LIKE 'jobs_trio:%'"
            )
        stopped: list[int] = []
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            code, took = await exit_after_sigterm(worker, within=60)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    print(f"\nexit {code} {took:.2f} s after SIGTERM, idle, backends stopped (grace {grace})")
    assert code == 0, worker.output()
    assert took < grace + 1.0, f"{took:.2f} s\n{worker.output()}"
