# The upgrade test (issue 49), kept for every release from now on, on SQLite and PostgreSQL: a
# database written by the PREVIOUS release's own code (releases/: its source, run in processes
# of its own) holding jobs in every state, steps, events, cron marks and outbox rows; migrated by
# this release while a worker and an application of the previous release run (on PostgreSQL,
# behind a reader's open transaction); then old and new workers side by side, and an old one
# started after the migration (a rolling deploy's restart, a rollback). Nothing lost, nothing
# run twice, no attempt charged. Then a next release's incompatible migration: the previous
# release refuses to start. At each release, add the previous one to RELEASES (releases/README.md).
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import jobs_trio
from jobs_trio._core.records import JobState
from jobs_trio._core.version import VERSION
from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import migrate_database
from tests.conftest import require_postgres
from tests.drivers.test_schema_levels import (
    BREAKING,
    Database,
    next_migration,
    next_version,
    postgres_database,
    sqlite_database,
)
from tests.helpers.process_helpers import killed_on_exit, until
from tests.upgrade.upgrade_jobs import ONLY_A, ONLY_B, ONLY_NEW, ledger, make_registry

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


@attrs.frozen
class Release:
    version: str
    archive: str  # in releases/: `git archive` of its src/jobs_trio


RELEASES = [Release("0.1.0", "jobs_trio-0.1.0.tar.gz")]

# PostgreSQL: a report's transaction on the jobs table for this long while the migration runs
# (the 20 s: JOBS_TRIO_UPGRADE_READER_SECONDS=20).
READER_SECONDS = float(os.environ.get("JOBS_TRIO_UPGRADE_READER_SECONDS", "1.0"))
WITHIN = 60.0  # a deadline for what takes seconds, with room for a loaded machine


@attrs.define
class OldRelease:
    """Processes of the previous release on one database, its marks and ledger in ``folder``."""

    src: Path
    folder: Path
    url: str
    schema: str
    started: list[trio.Process]
    logs: dict[str, Path] = attrs.field(factory=dict)

    @property
    def marks(self) -> Path:
        return self.folder / "marks"

    @property
    def ledger(self) -> Path:
        return self.folder / "ledger.jsonl"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBS_TRIO", "PYTHON"))}
        # That release's package first: ahead of this one's (installed, or editable).
        return {
            **env,
            "PYTHONPATH": str(self.src),
            "UPGRADE_LEDGER": str(self.ledger),
            "UPGRADE_MARKS": str(self.marks),
        }

    async def start(self, mode: str, name: str) -> trio.Process:
        log = self.folder / f"{name}.log"
        self.logs[name] = log
        with log.open("wb") as stderr:
            process = await trio.lowlevel.open_process(
                [sys.executable, str(HERE / "old_release.py"), mode, self.url, self.schema],
                cwd=self.folder,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                env=self.env(),
            )
        self.started.append(process)
        return process

    async def mark(self, name: str, process: trio.Process | None = None) -> dict[str, Any]:
        """The mark ``name`` a process writes when it is ready (failing at once if it died)."""
        path = self.marks / f"{name}.json"

        async def there() -> bool:
            if process is not None and process.poll() is not None:
                exited = process.returncode
                pytest.fail(f"{name}: the old release exited {exited}:\n{self.output()}")
            return path.exists()

        await until(f"the old release's {name}", WITHIN, there)
        found: dict[str, Any] = json.loads(path.read_text())
        return found

    def output(self) -> str:
        return "\n".join(f"--- {n}\n{p.read_text(errors='replace')}" for n, p in self.logs.items())


def unpacked(release: Release, into: Path) -> Path:
    with tarfile.open(HERE / "releases" / release.archive) as archive:
        archive.extractall(into, filter="data")
    return into / "src"


@contextlib.asynccontextmanager
async def a_database(kind: str, tmp_path: Path, pg_schema: str) -> AsyncIterator[Database]:
    opened = sqlite_database(tmp_path) if kind == "sqlite" else postgres_database(pg_schema)
    async with opened as database:
        yield database


def options(database: Database) -> dict[str, Any]:
    return {"schema": database.schema} if database.schema else {}


async def hold_a_reader(
    url: str, schema: str, seconds: float, held: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """A report's transaction on the jobs table, open for ``seconds`` and until the migration
    gave way to it once (a loaded machine's migration may take that long to reach the table)."""
    from tests.drivers.test_postgres_driver import open_admin
    from tests.drivers.test_postgres_migration_locks import blocked_tries

    async with open_admin(url) as admin:
        await admin.execute("SET application_name = 'nightly-report'")
        await admin.execute("BEGIN")
        await admin.fetchval(f'SELECT count(*) FROM "{schema}".jobs')
        held.append(await admin.fetchval("SELECT pg_backend_pid()"))
        await trio.sleep(seconds)
        with trio.fail_after(WITHIN):
            while not blocked_tries(caplog):
                await trio.sleep(0.05)
        await admin.execute("COMMIT")


async def states(driver: Driver, ids: list[str]) -> dict[str, JobState | None]:
    found = {}
    for job_id in ids:
        record = await driver.get(job_id)
        found[job_id] = record.state if record is not None else None
    return found


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r.version)
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_an_upgrade_from_the_previous_release_loses_nothing_and_runs_nothing_twice(
    kind: str,
    release: Release,
    tmp_path: Path,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if kind == "postgres":
        require_postgres()
    (tmp_path / "old" / "marks").mkdir(parents=True)
    src = unpacked(release, tmp_path / "release")
    # This process runs jobs too, and writes to the same ledger.
    monkeypatch.setenv("UPGRADE_LEDGER", str(tmp_path / "old" / "ledger.jsonl"))
    monkeypatch.setenv("UPGRADE_MARKS", str(tmp_path / "old" / "marks"))
    caplog.set_level("INFO", logger="jobs_trio")
    async with a_database(kind, tmp_path, pg_schema) as database, killed_on_exit() as started:
        old = OldRelease(src, tmp_path / "old", database.url, database.schema, started)

        # 1. The previous release writes its database, and stays on as its worker and app.
        a = await old.start("fixture", "fixture")
        fixture = await old.mark("fixture", a)
        assert fixture["release"] == release.version  # its own code, not this one's
        ids: dict[str, Any] = fixture["ids"]

        # 2. This release migrates it while they run (PostgreSQL: behind a report's reader).
        reader: list[int] = []
        async with trio.open_nursery() as nursery:
            if kind == "postgres" and READER_SECONDS > 0:
                nursery.start_soon(
                    hold_a_reader, database.url, database.schema, READER_SECONDS, reader, caplog
                )
                with trio.fail_after(WITHIN):
                    while not reader:
                        await trio.sleep(0.01)
            began = trio.current_time()
            applied = await migrate_database(database.url, **options(database))
            migration_took = trio.current_time() - began
        migrated_at = time.time()
        assert applied, "the previous release's schema had nothing to migrate"
        (old.marks / "stop-enqueuing").touch()
        enqueuer = await old.mark("enqueuer", a)

        # 3. Old and new side by side: a worker of the previous release started after the
        # migration (a rollout's restart, a rollback), and this release's worker and relay.
        b = await old.start("worker", "worker")
        async with (
            jobs_trio.open_driver(database.url, **options(database)) as driver,
            jobs_trio.open_worker(
                driver,
                make_registry(with_future=True),
                queues=["default", ONLY_NEW],
                concurrency=4,
                lifecycle=None,
                poll_interval=0.1,
            ),
            jobs_trio.open_relay(
                jobs_trio.Outbox(driver), driver, drain_on_shutdown=False, poll_interval=0.1
            ),
        ):
            await old.mark("worker", b)
            # What the new release's application and operators do after the upgrade.
            await jobs_trio.send_event(driver, "up.paid", {"paid": True}, key="order-1")
            (old.marks / "flaky-ok").touch()
            await driver.retry(ids["flaky"])
            registry = make_registry(with_future=True)
            # The key the previous release's job holds still holds: one job, then run.
            work = registry.get("up.work")
            assert await work.enqueue(driver, {}, key="up-key") == ids["keyed"]
            await driver.run_now(ids["keyed"])
            queues = {ONLY_A: "up.on_a", ONLY_B: "up.on_b", ONLY_NEW: "up.on_new"}
            after = {
                queue: [await registry.get(name).enqueue(driver, {"n": n}) for n in range(3)]
                for queue, name in queues.items()
            }
            after["default"] = [await work.enqueue(driver, {}) for _ in range(4)]
            lines = ledger(str(old.ledger))
            enqueued = [line["job"] for line in lines if line["kind"] == "enqueued"]
            to_finish = [
                *ids["completed"],
                *ids["delayed"],
                *ids["slow"],
                *ids["outbox"],
                ids["flaky"],
                ids["sleeper"],
                ids["waiter"],
                ids["keyed"],
                *enqueued,
                *(job_id for queue_ids in after.values() for job_id in queue_ids),
            ]

            async def all_finished() -> bool:
                found = await states(driver, to_finish)
                return set(found.values()) == {JobState.COMPLETED}

            async def ticked_since_migration() -> bool:
                fires = [x for x in ledger(str(old.ledger)) if x["kind"] == "tick"]
                return any(x["scheduled"] > migrated_at for x in fires)

            await until("every job to finish", WITHIN, all_finished)
            await until("a cron fire after the migration", WITHIN, ticked_since_migration)

            # The previous release's workers drain and exit 0; then the job they parked, which
            # this release knows, runs once retried.
            for process in (a, b):
                process.send_signal(signal.SIGTERM)
            with trio.fail_after(WITHIN):
                codes = [await a.wait(), await b.wait()]
            assert codes == [0, 0], old.output()
            await driver.retry(ids["future"])

            async def future_ran() -> bool:
                future = await driver.get(ids["future"])
                return future is not None and future.state is JobState.COMPLETED

            await until("the parked job to run", WITHIN, future_ran)
            records = {job_id: await driver.get(job_id) for job_id in [*to_finish, ids["future"]]}
            cancelled = await driver.get(ids["cancelled"])

        lines = ledger(str(old.ledger))
        runs = Counter(x["job"] for x in lines if x["kind"] in ("run", "tick"))
        steps = Counter((x["job"], x["step"]) for x in lines if x["kind"] == "step")
        by_pid = {x["job"]: x["pid"] for x in lines if x["kind"] == "run"}

        # Nothing lost: every job is there, in the state it should be.
        assert cancelled is not None and cancelled.state is JobState.CANCELLED
        assert all(r is not None and r.state is JobState.COMPLETED for r in records.values())
        # Nothing run twice: one run each; a retried dead job twice (it ran and died before),
        # a suspended one once before and once after its suspension, never its steps again.
        twice = {ids["flaky"], ids["sleeper"], ids["waiter"]}
        assert all(runs[j] for j in records)
        assert {j: n for j, n in runs.items() if n != (2 if j in twice else 1)} == {}
        assert steps[(ids["sleeper"], "before")] == steps[(ids["sleeper"], "after")] == 1
        assert steps[(ids["waiter"], "before")] == 1
        sleeper, waiter = records[ids["sleeper"]], records[ids["waiter"]]
        assert sleeper is not None and sleeper.result[0].startswith("before by")
        assert waiter is not None and waiter.result[1] == {"paid": True}
        # No attempt charged: each job's one counted attempt, and each cron time fired once.
        charged = {j: r.attempts for j, r in records.items() if r is not None and r.attempts != 1}
        assert charged == {}
        fires = Counter(x["scheduled"] for x in lines if x["kind"] == "tick")
        assert [when for when, n in fires.items() if n > 1] == []
        # The application of the previous release lost no enqueue while the migration ran.
        assert (enqueuer["failed"], enqueuer["enqueued"]) == (0, len(enqueued)) and enqueued
        # Side by side: each worker ran the jobs of its own queue, whichever release.
        assert {by_pid[j] for j in after[ONLY_A]} == {a.pid}
        assert {by_pid[j] for j in after[ONLY_B]} == {b.pid}
        assert {by_pid[j] for j in after[ONLY_NEW]} == {os.getpid()}
        if reader:
            # The migration waited for the reader, naming it, and the fleet went on meanwhile.
            assert migration_took >= READER_SECONDS - 0.2
            from tests.drivers.test_postgres_migration_locks import blocked_tries

            blocked = blocked_tries(caplog)
            assert blocked and all(
                fields["pids"].split(",")[0] == str(reader[0]) for fields in blocked
            )

        # 4. A next release's migration that raises the compatibility level: the previous
        # release refuses to start, saying why.
        breaking = next_migration(next_version(), BREAKING, database.schema)
        assert breaking.level is not None
        await database.migrate_next(breaking, breaking.level)
        c = await old.start("worker", "refused")
        with trio.fail_after(WITHIN):
            assert await c.wait() != 0
        assert "X_SCHEMA" in old.logs["refused"].read_text(), old.output()

    print(
        f"\n{kind}, from {release.version} to {VERSION}: migrated {applied} in"
        f" {migration_took:.1f} s (reader {READER_SECONDS if reader else 0:g} s); the old app"
        f" enqueued {enqueuer['enqueued']}, {enqueuer['failed']} failed; {len(records)} jobs"
        f" run, {sum(runs.values())} runs"
    )
