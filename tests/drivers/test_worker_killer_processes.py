# A job that SIGKILLs every worker process that runs it, among 50 ordinary jobs, on three real
# `jobs-trio worker` processes each restarted when it dies: the orphan rule (docs/model.md, "A
# worker's death") dead-letters the killer and charges none of its neighbours, on SQLite and
# PostgreSQL. The jobs are tests/apps/killer_app.
from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers._rules import KILLED_WORKER_ERROR
from tests.apps.killer_app import registry
from tests.drivers.test_processes_postgres import fresh_database
from tests.helpers.process_helpers import JOBS_TRIO, LOADED, ROOT, killed_on_exit, record, until

pytestmark = pytest.mark.slow

APP = "tests.apps.killer_app:registry"
WORKERS = 3
LEASE = 4.0  # short, so each death is found soon; long enough that load does not lapse it
# The ordinary jobs: 0.5 to 3 s each, 3 attempts (the killer has 3 too).
SECONDS = [0.5 + 0.5 * (i % 6) for i in range(50)]
# What the rule takes: the killer dies three times (beside others twice, then alone), each
# death found a lease later, and a restarted worker's start; the 50 jobs take ~5 s of 30 slots.
# Before the rule this ended too (the killer out of attempts), with 9 neighbours charged.
WITHIN = 60.0 + 4 * LOADED


@contextlib.asynccontextmanager
async def job_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    async with fresh_database(request.getfixturevalue("postgres_url")) as url:
        yield url


async def keep_running(
    slot: int, url: str, tmp_path: Path, processes: list[trio.Process], deaths: list[int]
) -> None:
    """One worker process, started again each time it dies, until cancelled."""
    for n in range(1000):
        with (tmp_path / f"worker-{slot}-{n}.log").open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [*JOBS_TRIO, "worker", APP, "--db", url, "--lease", str(LEASE)],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stderr=stderr,
            )
        processes.append(process)
        await process.wait()
        deaths.append(process.returncode)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_fifty_jobs_beside_a_worker_killer_are_charged_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with job_store(kind, tmp_path, request) as url, open_driver(url) as driver:
        killer = await registry.require("app.killer").enqueue(driver, None)
        ordinary = await registry.require("app.ordinary").enqueue_many(driver, SECONDS)

        async def all_ended() -> bool:
            records = [await record(driver, job_id) for job_id in [killer, *ordinary]]
            return all(r.state in (JobState.COMPLETED, JobState.DEAD) for r in records)

        deaths: list[int] = []
        began = trio.current_time()
        async with killed_on_exit() as processes, trio.open_nursery() as nursery:
            for slot in range(WORKERS):
                nursery.start_soon(keep_running, slot, url, tmp_path, processes, deaths)
            await until("every job to end, the killer too", WITHIN, all_ended)
            took = trio.current_time() - began
            nursery.cancel_scope.cancel()  # no more restarts; killed_on_exit ends the rest

        records = [await record(driver, job_id) for job_id in ordinary]
        charged = [r for r in records if r.attempts > 1]
        dead = [r for r in records if r.state is JobState.DEAD]
        orphaned = [r for r in records if r.orphans]
        end = await record(driver, killer)
        print(
            f"\n{kind}: {len(charged)} of 50 charged, {len(dead)} dead-lettered, {len(orphaned)}"
            f" orphaned (most {max((r.orphans for r in records), default=0)}); killer"
            f" {end.state.value} after {end.attempts} attempts, {end.orphans} orphanings;"
            f" {deaths.count(-signal.SIGKILL)} workers SIGKILLed; {took:.1f} s"
        )
        assert (len(charged), len(dead)) == (0, 0), [(r.attempts, r.last_error) for r in charged]
        assert all(r.state is JobState.COMPLETED and r.attempts == 1 for r in records)
        # Dead-lettered by the rule: it ran alone (orphaned twice before) and its worker died.
        assert (end.state, end.last_error) == (JobState.DEAD, KILLED_WORKER_ERROR)
        assert end.attempts == 1 and end.orphans == 3
        history = await driver.load_attempts(killer)
        assert [h.outcome for h in history] == ["orphaned", "orphaned", "dead-lettered"]
