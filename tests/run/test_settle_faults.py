# The settle path under faults, with real `jobs-trio worker` processes on SQLite and PostgreSQL:
# poison settlements among good ones, the database write-locked across SIGTERM, and a lock held
# on a running job while its lease runs out. The jobs are tests/apps/settle_app.
from __future__ import annotations

import contextlib
import functools
import itertools
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.settle_app import POISON_MARK, registry
from tests.conftest import require_postgres
from tests.drivers.test_postgres_driver import Admin, open_admin
from tests.drivers.test_processes_postgres import fresh_database
from tests.helpers.process_helpers import LOADED, record, started, until, worker_processes

pytestmark = pytest.mark.slow

workers = functools.partial(worker_processes, "tests.apps.settle_app")
SCHEMA = "jobs_trio"  # the worker command's default schema, in a database of the test's own


class Store:
    """One database of a test, SQLite or PostgreSQL, and the faults a test puts on it."""

    def __init__(self, kind: str, url: str, admin: Admin | None) -> None:
        self.kind = kind
        self.url = url
        self._admin = admin

    @property
    def path(self) -> Path:
        return Path(self.url.removeprefix("sqlite:///"))

    async def refuse_poison_results(self) -> None:
        """A trigger that refuses any result holding POISON_MARK: the database itself says no."""
        if self._admin is None:
            with contextlib.closing(sqlite3.connect(self.path)) as conn, conn:
                conn.execute(
                    "CREATE TRIGGER jt_refuse_poison BEFORE UPDATE OF result ON jobs"
                    f" WHEN NEW.result LIKE '%{POISON_MARK}%'"
                    " BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END"
                )
            return
        await self._admin.execute(
            f"""
            CREATE FUNCTION {SCHEMA}.jt_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.result LIKE '%{POISON_MARK}%' THEN
                    RAISE EXCEPTION 'refused by the test trigger';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER jt_refuse_poison BEFORE UPDATE ON {SCHEMA}.jobs
            FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.jt_refuse_poison();
            """
        )

    @contextlib.asynccontextmanager
    async def locked(self, job_id: str) -> AsyncIterator[Callable[[], Any]]:
        """Hold a lock in the way of the worker's writes of ``job_id``: the whole SQLite file
        (BEGIN IMMEDIATE from another connection), or the job's row on PostgreSQL (SELECT ...
        FOR UPDATE). Yields a callable that releases it early; released on the way out."""
        held = True
        if self._admin is None:
            conn = sqlite3.connect(self.path, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")

            async def release() -> None:
                nonlocal held
                if held:
                    held = False
                    conn.execute("ROLLBACK")
                    conn.close()

        else:
            admin = self._admin
            await admin.execute("BEGIN")
            await admin.execute(f"SELECT 1 FROM {SCHEMA}.jobs WHERE id = '{job_id}' FOR UPDATE")

            async def release() -> None:
                nonlocal held
                if held:
                    held = False
                    await admin.execute("ROLLBACK")

        try:
            yield release
        finally:
            with trio.CancelScope(shield=True):
                await release()


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        async with open_driver(url):  # the schema exists before a worker opens the file
            pass
        yield Store("sqlite", url, None)
        return
    async with fresh_database(require_postgres()) as url, open_admin(url) as admin:
        yield Store("postgres", url, admin)


def job(name: str) -> Any:
    return registry.require(name)


async def test_poison_settlements_fail_alone_and_every_good_job_completes_once(
    store: Store, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.txt"
    await store.refuse_poison_results()
    async with open_driver(store.url) as driver:
        good = await job("settle.ok").enqueue_many(
            driver, [{"seen": str(seen), "n": n} for n in range(25)]
        )
        poison = {
            "settle.nul": await job("settle.nul").enqueue(driver, {}),
            "settle.surrogate": await job("settle.surrogate").enqueue(driver, {}),
            "settle.refused": await job("settle.refused").enqueue(driver, {}),
        }
        good += await job("settle.ok").enqueue_many(
            driver, [{"seen": str(seen), "n": n} for n in range(25, 45)]
        )
        async with workers(tmp_path, store.url, 1, "--concurrency", "4", "--lease", "2") as [proc]:
            await started([proc])

            async def all_settled() -> bool:
                states = [(await record(driver, i)).state for i in [*good, *poison.values()]]
                return all(s in (JobState.COMPLETED, JobState.DEAD) for s in states)

            await until("every job settled", 60, all_settled)
            assert proc.process.returncode is None, proc.output()  # the worker stays up
            proc.signal(signal.SIGTERM)
            assert await proc.exit_code(within=15) == 0, proc.output()
        for n, job_id in enumerate(good):
            r = await record(driver, job_id)
            assert (r.state, r.attempts, r.result) == (JobState.COMPLETED, 1, {"n": n})
        assert sorted(seen.read_text().split()) == sorted(good)  # each ran exactly once
        errors = {name: (await record(driver, i)) for name, i in poison.items()}
        for r in errors.values():
            assert (r.state, r.attempts, r.result) == (JobState.DEAD, 1, None)
        # Readable: the poison shown as escapes, the refusal named.
        assert "bad byte \\x00 in input" in (errors["settle.nul"].last_error or "")
        assert "/data/\\udcff.csv" in (errors["settle.surrogate"].last_error or "")
        refused = errors["settle.refused"].last_error or ""
        assert "result could not be stored" in refused and "refused by the test trigger" in refused
        print(f"\n{store.kind}: {len(good)} good jobs completed, attempts 1 each; worker exit 0")
        for name, r in errors.items():
            print(f"  {name}: {r.state.value}, attempts {r.attempts}: {r.last_error!r}"[:240])


async def hold_a_finished_result(driver: Driver, tmp_path: Path) -> tuple[str, Path]:
    """Enqueue settle.hold and wait until its body runs; answer its id and the release file."""
    files = {k: tmp_path / k for k in ("entered", "release", "returned")}
    job_id = await job("settle.hold").enqueue(driver, {k: str(v) for k, v in files.items()})
    await until("the body to run", 20, functools.partial(_exists, files["entered"]))
    return job_id, files["release"]


async def _exists(path: Path) -> bool:
    return path.exists()


@pytest.mark.parametrize("lock", ["kept", "released-inside-the-grace"])
async def test_a_result_unwritable_at_sigterm_is_written_or_named(
    store: Store, tmp_path: Path, lock: str
) -> None:
    async with (
        open_driver(store.url) as driver,
        workers(tmp_path, store.url, 1, "--grace", "2") as [proc],
    ):
        await started([proc])
        job_id, release_body = await hold_a_finished_result(driver, tmp_path)
        async with store.locked(job_id) as release_lock:
            release_body.touch()
            returned = tmp_path / "returned"
            await until("the body to return", 20, functools.partial(_exists, returned))
            # Past the return: the worker now holds a finished result it cannot write.
            sent = trio.current_time()
            proc.signal(signal.SIGTERM)
            if lock == "kept":
                code = await proc.exit_code(within=2 + 1 + LOADED)
                took = trio.current_time() - sent
                # Read while the lock still holds: the worker is gone, and a settle it had sent
                # to PostgreSQL may still land once the lock goes (written after all, which
                # loses nothing; the log had said it might not be).
                r = await record(driver, job_id)
                assert r.state is JobState.RUNNING and r.result is None, r
            else:
                await trio.sleep(0.5)  # the lock is held for half the grace, then let go
                await release_lock()
                code = await proc.exit_code(within=2 + 1 + LOADED)
                took = trio.current_time() - sent
        log = proc.output()
        print(f"\n{store.kind}, lock {lock}: exit {code} {took:.2f} s after SIGTERM (--grace 2)")
        for line in log.splitlines():
            if "settle-abandoned" in line or "lifecycle.abandoned" in line:
                print("  " + line[:300])
        if lock == "kept":
            # The grace, the exit, a loaded machine's share; a worker that waited for the lock
            # would not have exited while the test held it.
            assert code != 0 and took <= 2 + 1 + LOADED, (code, took, log)
            assert "jobs.worker.settle-abandoned" in log and job_id in log
        else:
            r = await record(driver, job_id)
            assert code == 0, log
            assert (r.state, r.attempts, r.result) == (JobState.COMPLETED, 1, {"held": True})
            assert "settle-abandoned" not in log
            print(f"  job {r.state.value}, attempts {r.attempts}, result {r.result}")


def spans(log: Path) -> list[tuple[float, float, str]]:
    """(start, end, worker) of every run of settle.span, from the bodies' own lines."""
    opened: dict[str, float] = {}
    done: list[tuple[float, float, str]] = []
    for line in log.read_text().splitlines():
        worker, what, at = line.split()
        if what == "start":
            opened[worker] = float(at)
        else:
            done.append((opened.pop(worker), float(at), worker))
    assert not opened, f"runs without an end: {opened}"
    return sorted(done)


async def test_a_lock_outlasting_the_lease_never_lets_the_job_run_twice_at_once(
    store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "spans.txt"
    async with open_driver(store.url) as driver:
        # The first run lasts until its lost lease stops it (100 s, past any wait below), so it
        # is still running once the second worker has started and the lock is taken: at 4 s,
        # then 8 s, a loaded machine (the suite beside two busy loops on 2 cores) started the
        # second worker after the body had ended, and it completed unstopped. Runs after it
        # take 2 s.
        payload = {"log": str(log), "seconds": 2, "first_seconds": 100}
        job_id = await job("settle.span").enqueue(driver, payload)
        async with workers(tmp_path, store.url, 1, "--lease", "2") as [first]:
            await started([first])
            await until("the first run to start", 20, functools.partial(_exists, log))
            async with workers(tmp_path, store.url, 1, "--lease", "2") as [second]:
                await started([second])
                async with store.locked(job_id):
                    # Held past the lease: the first worker cannot renew (its renewal fails or
                    # hangs); the lock ends once it has stopped the run (2 s of lease; the
                    # bound is for a loaded machine).
                    async def stopped() -> bool:
                        return "jobs.lease.expired" in first.output()

                    await until("the first worker to stop its run", 30, stopped)

                async def completed() -> bool:
                    return (await record(driver, job_id)).state is JobState.COMPLETED

                await until("the job to complete", 30, completed)
                for proc in (first, second):
                    proc.signal(signal.SIGTERM)
                    assert await proc.exit_code(within=15) == 0, proc.output()
    runs = spans(log)
    assert len(runs) >= 2, runs  # the first run was stopped, and the job ran again
    for (_, end, who), (start, _, next_who) in itertools.pairwise(runs):
        assert end <= start, f"{who} still ran the job when {next_who} started it: {runs}"


async def test_one_locked_row_costs_no_other_job_its_renewal_or_its_settle(
    tmp_path: Path,
) -> None:
    # An operator's session holds ONE running job's row FOR UPDATE. A review found the worker's
    # renewal of all its runs waiting on it (then failing: every lease lost, every job run
    # again) and the settle batch holding that row failing whole, so no other finished job
    # was written while the lock lasted. Now only the locked job waits.
    seen = tmp_path / "seen.txt"
    async with (
        fresh_database(require_postgres()) as url,
        open_admin(url) as admin,
        open_driver(url) as driver,
    ):
        store = Store("postgres", url, admin)
        # Bodies longer than the lease: they live on their renewals.
        payloads = [{"seen": str(seen), "n": n, "pause": 4.0} for n in range(10)]
        victim, *others = await job("settle.ok").enqueue_many(driver, payloads)

        async def states() -> dict[str, JobState]:
            return {j: (await record(driver, j)).state for j in [victim, *others]}

        async with workers(tmp_path, url, 1, "--concurrency", "10", "--lease", "3") as [
            worker
        ]:  # renewals every second
            await started([worker])

            async def all_running() -> bool:
                return set((await states()).values()) == {JobState.RUNNING}

            await until("all ten to run", 20, all_running)
            async with store.locked(victim):

                async def others_completed() -> bool:
                    now = await states()
                    return all(now[j] is JobState.COMPLETED for j in others)

                # While the lock is held, however long that takes: the nine bodies end (4 s),
                # their leases renewed meanwhile past the locked row, and their settlements
                # written past it.
                await until(
                    "the nine others to complete while one row is locked", 30, (others_completed)
                )
                assert (await states())[victim] is not JobState.COMPLETED

            async def victim_completed() -> bool:
                return (await states())[victim] is JobState.COMPLETED

            await until("the locked job to complete once its row is free", 30, victim_completed)
            worker.signal(signal.SIGTERM)
            assert await worker.exit_code(within=15) == 0, worker.output()
        log = worker.output()
        for job_id in others:
            done = await record(driver, job_id)
            assert done.attempts == 1, (job_id, done.attempts, log[-3000:])
        assert "jobs.lease.row-locked" in log, log[-3000:]
    runs = seen.read_text().split()
    assert sorted(j for j in runs if j != victim) == sorted(others)  # each of the nine once
