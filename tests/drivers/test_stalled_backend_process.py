# A real `jobs-trio worker` on PostgreSQL whose server stops answering altogether (its backends
# SIGSTOPped: not even a cancel request is served) at SIGTERM: the process is still gone within
# its grace, naming the job it could not settle.
from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from jobs_trio.drivers._open_driver import open_driver
from tests.apps.drain_jobs_app import registry
from tests.helpers.process_helpers import LOADED, started, until
from tests.run.test_drain_processes import body_started, exit_after_sigterm, workers

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


async def test_with_its_backends_stopped_the_worker_is_gone_within_its_grace(
    tmp_path: Path,
) -> None:
    from tests.conftest import require_postgres
    from tests.drivers.test_postgres_driver import open_admin
    from tests.drivers.test_processes_postgres import fresh_database

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
    # Gone at the grace, the hand-back abandoned; waiting on the stopped server instead took 5 s
    # more for each connection.
    assert took < grace + 1.0 + LOADED, f"{took:.2f} s\n{worker.output()}"
    # The body unwound at the drain, but its hand-back could not be written: named, not lost
    # quietly (its lease lapses and it runs again elsewhere).
    assert code != 0, worker.output()
    assert "jobs.lifecycle.abandoned" in worker.output(), worker.output()


async def until_quiet(url: str) -> None:
    """Until every connection of the worker's on ``url`` is idle: its start-up statements (a
    claim, its announcement, a look at the queues) answered. One still in flight when the
    backends stop is waited for as a claim is (to the end of the grace, the claim test below),
    which a loaded machine showed in the idle test as an exit 5.06 s after SIGTERM."""
    from tests.drivers.test_postgres_driver import open_admin

    async with open_admin(url) as admin:

        async def quiet() -> bool:
            return bool(
                await admin.fetchval_now(
                    "SELECT count(*) > 0 AND bool_and(state = 'idle') FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name LIKE 'jobs_trio:%'"
                )
            )

        await until("every connection of the worker's idle", 20, quiet)


@contextlib.asynccontextmanager
async def backends_stopped(url: str) -> AsyncIterator[None]:
    """Once the idle worker on ``url`` has its pool and LISTEN connections, SIGSTOP their
    backends (the server stops answering it altogether); SIGCONT them on the way out."""
    from tests.drivers.test_postgres_driver import open_admin

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
        yield
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)


async def test_an_idle_worker_whose_backends_are_stopped_exits_within_its_grace(
    tmp_path: Path,
) -> None:
    # Nothing to settle, so no abandoned job ends the process early: it exits 0 through its
    # goodbye and the driver's close, on a server that no longer answers. Each used to wait
    # for its connection's end (10 s after a 1 s grace, a review; then 5 s with the goodbye at
    # 2 s and each close at 1 s): now the first that finds the server not answering a cancel
    # makes the rest drop their connections at once (~2 s here).
    from tests.conftest import require_postgres
    from tests.drivers.test_processes_postgres import fresh_database

    # Idle: its start-up statements answered first (until_quiet). A claim still sent between
    # that look and the SIGTERM is waited for to the end of the grace, then a second for its
    # cancel (the claim test below): the bound allows that, within the grace and a half second.
    grace = 3.0
    async with (
        fresh_database(require_postgres()) as url,
        workers(tmp_path, url, 1, "--grace", str(grace)) as [worker],
    ):
        await started([worker])
        await until_quiet(url)
        async with backends_stopped(url):
            code, took = await exit_after_sigterm(worker, within=60)
    print(f"\nexit {code} {took:.2f} s after SIGTERM, idle, backends stopped (grace {grace})")
    assert code == 0, worker.output()
    assert took < grace + 1.5, f"{took:.2f} s\n{worker.output()}"


async def test_a_transaction_cut_on_a_server_that_stopped_answering_holds_the_exit_a_second(
    tmp_path: Path,
) -> None:
    # The retention pruner's first batch (a transaction, run as the worker starts) waits on a
    # lock when the backends stop, and the drain cuts it. Its rollback waited for the server's
    # cancel for CLEANUP_SECONDS (5 s), past the grace: CI saw this idle worker exit 5.06 s
    # after SIGTERM with a 3 s grace. Now as long as a retire waits for a cancel (1 s); the
    # server is then known not to answer, and the goodbye and the closes add nothing more.
    from tests.conftest import require_postgres
    from tests.drivers.test_postgres_driver import open_admin
    from tests.drivers.test_processes_postgres import fresh_database

    grace = 3.0
    async with fresh_database(require_postgres()) as url, open_admin(url) as admin:
        await admin.execute("BEGIN")
        await admin.execute("LOCK TABLE jobs_trio.prune_turn IN ACCESS EXCLUSIVE MODE")
        # The pool's lock_timeout (2 s) would end the prune's wait 2 s after it began (its retry
        # is 30 s away): here it waits until the statement_timeout, past every look below.
        lock_waits = f"{url}?lock_timeout=0"
        async with workers(tmp_path, lock_waits, 1, "--grace", str(grace)) as [worker]:
            await started([worker])

            async def only_the_prune_busy() -> bool:
                # The prune waits on the lock, and nothing else of the worker's is in flight:
                # a statement of its start-up (a claim) sent and unanswered when the backends
                # stop is waited for to the end of the grace (it may have committed: the claim
                # test below), which a loaded machine showed here as an exit 3.10 s after
                # SIGTERM.
                return bool(
                    await admin.fetchval_now(
                        "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock') = 1"
                        " AND count(*) FILTER (WHERE state <> 'idle'"
                        " AND wait_event_type IS DISTINCT FROM 'Lock') = 0"
                        " FROM pg_stat_activity WHERE datname = current_database()"
                        " AND application_name LIKE 'jobs_trio:%'"
                    )
                )

            with trio.move_on_after(20) as waited:
                while not await only_the_prune_busy():
                    await trio.sleep(0.05)
            if waited.cancelled_caught:
                activity = await admin.fetch(
                    "SELECT application_name, state, wait_event_type, left(query, 60)"
                    " FROM pg_stat_activity WHERE datname = current_database()"
                )
                pytest.fail(
                    "20 s without the worker's prune alone waiting on the locked turn\n"
                    f"{[tuple(row) for row in activity]}\n{worker.output()}"
                )
            async with backends_stopped(url):
                code, took = await exit_after_sigterm(worker, within=60)
        await admin.execute("ROLLBACK")
    print(f"\nexit {code} {took:.2f} s after SIGTERM, a prune cut (grace {grace})")
    assert code == 0, worker.output()
    # 2.0-2.2 s alone, 3.10 s loaded; the rollback's old 5 s wait made it 6 s or more.
    assert took < grace + 1.0, f"{took:.2f} s\n{worker.output()}"


async def test_a_claim_unanswered_when_the_backends_stopped_holds_the_exit_a_second_past_its_grace(
    tmp_path: Path,
) -> None:
    # The claim in flight may have committed: its jobs' writes are decided, so the teardown
    # waits for it to the end of the grace (Budget.writes). Past that, the cut claim's cancel
    # waits 1 s for an answer that never comes; the goodbye and the closes then add nothing:
    # the server was found not answering, and they drop their connections (5 s more before).
    from tests.conftest import require_postgres
    from tests.drivers.test_processes_postgres import fresh_database
    from tests.run.test_drain_processes import stalled

    grace = 3.0
    async with (
        fresh_database(require_postgres()) as url,
        workers(tmp_path, url, 1, "--grace", str(grace)) as [worker],
    ):
        await started([worker])
        async with open_driver(url) as driver:
            # Due in a second: the worker's claim for it meets the locked table.
            marks = str(tmp_path / "marks.txt")
            await registry.require("drain.wait").enqueue(driver, {"marks": marks}, delay=1.0)
        async with stalled(url) as stall:
            await stall.a_claim_waits()
            async with backends_stopped(url):
                code, took = await exit_after_sigterm(worker, within=60)
    print(f"\nexit {code} {took:.2f} s after SIGTERM, a claim unanswered (grace {grace})")
    # The grace and the cut claim's second: 4.0 s alone, 5.01 s beside two busy processes; the
    # cancel's old 5 s wait for the server made it 9 s.
    assert took < grace + 1.0 + LOADED, f"{took:.2f} s\n{worker.output()}"
    assert code == 0, worker.output()


async def test_a_second_sigterm_after_the_drain_does_not_kill_the_closing_worker(
    tmp_path: Path,
) -> None:
    # A supervisor that sends SIGTERM twice: the second, once the lifecycle had ended and the
    # driver was closing, met the signal's default action and killed the process (exit 143
    # after a clean drain; a review). The server stopped makes that closing last ~2 s.
    from tests.conftest import require_postgres
    from tests.drivers.test_processes_postgres import fresh_database

    async with (
        fresh_database(require_postgres()) as url,
        workers(tmp_path, url, 1, "--grace", "4") as [worker],
    ):
        await started([worker])
        async with backends_stopped(url):
            worker.signal(signal.SIGTERM)

            async def drained() -> bool:
                return "jobs.lifecycle.closed" in worker.output()

            await until("the lifecycle to end", 20, drained)
            worker.signal(signal.SIGTERM)
            code = await worker.exit_code(within=30)
    assert code == 0, worker.output()
