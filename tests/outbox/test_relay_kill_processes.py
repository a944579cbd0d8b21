# The relay's exactly-once against real SIGKILLs (issue 33): a relay process is killed at every
# step of its pass, round after round, while a worker runs the jobs and retention deletes them a
# second after they finish, on SQLite and PostgreSQL, one database and two, with keyed and
# unkeyed rows. After each kill the jobs it wrote run and are pruned, the key it found held is
# freed, and only THEN does a survivor relay take the rows again: every committed outbox row
# becomes exactly one job run (a row whose key a live job held when it was decided, none: that
# job ran for it), every rolled-back one none. JOBS_TRIO_KILL_ROUNDS=N runs N rounds (default 1).
from __future__ import annotations

import collections
import contextlib
import functools
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from prometheus_client import CollectorRegistry

import jobs_trio
from jobs_trio._core.metrics import Metrics
from jobs_trio._core.records import Complete, JobState
from jobs_trio.driver import Driver
from jobs_trio.testing.conformance.helpers import new_job
from tests.conftest import require_postgres
from tests.helpers.process_helpers import ROOT, until

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("JOBS_TRIO_KILL_ROUNDS", "1"))
TWO_STEP = ("claimed", "written", "deleted")  # two databases: take, write, delete, forget
IN_PLACE = ("in-transaction", "committed")  # one database: one transaction
# Killed after the rows were decided: a row whose key was held then stays a no-op for good.
DECIDED = {"written", "deleted", "committed"}
LEASE = 1.0
KEEP_FINISHED = 1.0


class Boom(Exception):
    pass


@attrs.frozen
class Databases:
    app_url: str
    app_schema: str
    jobs_url: str
    schema: str

    @property
    def one(self) -> bool:
        return (self.app_url, self.app_schema) == (self.jobs_url, self.schema)


@contextlib.asynccontextmanager
async def postgres_database(url: str) -> AsyncIterator[str]:
    """A database of its own on the test server (two databases: no probe can see across)."""
    name = f"jt_{uuid.uuid4().hex[:12]}"

    async def run(sql: str) -> None:
        async with jobs_trio.open_driver(url, migrate=True, schema=f"{name}_admin") as admin:
            await admin.bridge.run(  # type: ignore[attr-defined]
                lambda conn: conn.execute(sql), what="test database"
            )
            await admin.bridge.run(  # type: ignore[attr-defined]
                lambda conn: conn.execute(f"DROP SCHEMA {name}_admin CASCADE"), what="cleanup"
            )

    await run(f"CREATE DATABASE {name}")
    try:
        yield url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with trio.CancelScope(shield=True):
            await run(f"DROP DATABASE {name} WITH (FORCE)")


@contextlib.asynccontextmanager
async def databases(combination: str, tmp_path: Path) -> AsyncIterator[Databases]:
    app_file, jobs_file = f"sqlite:///{tmp_path / 'app.db'}", f"sqlite:///{tmp_path / 'jobs.db'}"
    schema = f"jt_{uuid.uuid4().hex[:12]}"
    if combination == "sqlite-one":
        yield Databases(app_file, "", app_file, "")
    elif combination == "sqlite-two":
        yield Databases(app_file, "", jobs_file, "")
    elif combination == "postgres-one":
        url = require_postgres()
        yield Databases(url, schema, url, schema)
    elif combination == "postgres-two":
        url = require_postgres()
        async with postgres_database(url) as app_url:
            yield Databases(app_url, schema, url, schema)
    else:
        assert combination == "sqlite-to-postgres"
        yield Databases(app_file, "", require_postgres(), schema)


def options(url: str, schema: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {}
    return {"schema": schema, "migrate": True, "drop_schema_on_close": True}


@contextlib.asynccontextmanager
async def opened(where: Databases) -> AsyncIterator[tuple[Driver, Driver]]:
    async with contextlib.AsyncExitStack() as stack:
        app_db = await stack.enter_async_context(
            jobs_trio.open_driver(where.app_url, **options(where.app_url, where.app_schema))
        )
        store = app_db
        if not where.one:
            store = await stack.enter_async_context(
                jobs_trio.open_driver(where.jobs_url, **options(where.jobs_url, where.schema))
            )
        yield app_db, store


class RelayProcess:
    """tests/apps/relay_kill_app.py: READY once open, one pass on a line of stdin, PAUSED at
    its step (then killed here), its stderr in a file."""

    def __init__(self, process: trio.Process, log: Path) -> None:
        self.process, self.log = process, log

    def said(self, line: str) -> bool:
        return line in self.log.read_text(errors="replace")


async def spawn(where: Databases, step: str, log: Path) -> RelayProcess:
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "tests.apps.relay_kill_app",
                where.app_url,
                where.app_schema,
                where.jobs_url,
                where.schema,
                step,
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stderr=stderr,
        )
    return RelayProcess(process, log)


# PostgreSQL, one database: the pass's one transaction is stopped inside, after its jobs are
# inserted, by a trigger that waits while the flag is up (the server's own pg_sleep, seen from
# here in pg_stat_activity); lowered after the kill, the orphaned transaction then rolls back.
STOP_INSIDE = (
    'CREATE TABLE "{s}".test_stop (stopped boolean NOT NULL)',
    'INSERT INTO "{s}".test_stop VALUES (false)',
    """CREATE FUNCTION "{s}".test_stop_here() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        WHILE (SELECT stopped FROM "{s}".test_stop) LOOP
            PERFORM pg_sleep(0.02);
        END LOOP;
        RETURN NULL;
    END $$""",
    'CREATE TRIGGER test_stop_here AFTER INSERT ON "{s}".jobs'
    ' FOR EACH STATEMENT EXECUTE FUNCTION "{s}".test_stop_here()',
)


async def sql(driver: Driver, statement: str, *args: Any) -> Any:
    async with jobs_trio.transaction(driver) as tx:
        return await tx.fetchval(statement, *args)


async def stopped_inside(store: Driver, schema: str) -> bool:
    waiting = await sql(
        store,
        "SELECT count(*)::int FROM pg_stat_activity WHERE application_name = $1"
        " AND wait_event = 'PgSleep'",
        f"jobs_trio:{schema}:pool",
    )
    return bool(waiting)


@pytest.mark.parametrize(
    "combination",
    ["sqlite-one", "sqlite-two", "postgres-one", "postgres-two", "sqlite-to-postgres"],
)
async def test_a_relay_killed_at_every_step_makes_each_committed_row_one_run(
    combination: str, tmp_path: Path
) -> None:
    runs: list[str] = []
    registry = jobs_trio.Registry()

    @registry.job("kill.ship", queue="ship")
    async def ship(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
        runs.append(payload["row"])

    expected: dict[str, int] = {}
    kills: collections.Counter[str] = collections.Counter()
    started: list[RelayProcess] = []
    async with (
        databases(combination, tmp_path) as where,
        opened(where) as (app_db, store),
        jobs_trio.open_worker(
            store,
            registry,
            queues=["ship"],
            poll_interval=0.05,
            retention=jobs_trio.Retention(keep_finished=KEEP_FINISHED, keep_dead=1.0, every=0.1),
            drain_on_shutdown=False,
        ),
    ):
        steps = IN_PLACE if where.one else TWO_STEP
        postgres_inside = where.one and where.jobs_url.startswith("postgres")
        if postgres_inside:
            for statement in STOP_INSIDE:
                await sql(store, statement.format(s=where.schema))
        outbox = jobs_trio.Outbox(app_db)
        survivor = jobs_trio.Relay(outbox, store, lease=LEASE, metrics=Metrics(CollectorRegistry()))

        async def nothing_left(check: Callable[[], Awaitable[bool]], what: str) -> None:
            await until(what, 30, check)

        async def store_empty() -> bool:
            return await store.list_jobs(limit=1000) == []

        async def outbox_moved() -> bool:
            await survivor._one_pass()
            return (await app_db.outbox_stats()).pending == 0

        async def all_run() -> bool:
            live = [
                j
                for j in await store.list_jobs(limit=1000)
                if j.state not in (JobState.COMPLETED, JobState.CANCELLED)
            ]
            return not live

        try:
            for round_ in range(ROUNDS):
                # Started together (their imports overlap), each waits for its turn.
                relays = {
                    step: await spawn(where, step, tmp_path / f"relay-{round_}-{step}.log")
                    for step in steps
                }
                started += relays.values()
                for relay in relays.values():
                    await until(
                        f"{relay.log.name} to open", 60, functools.partial(_said, relay, "READY")
                    )
                for step in steps:
                    tag = f"{round_}:{step}"
                    # A live job holds the key one row asks for, until after the kill.
                    holder = new_job("kill.holder", queue="held", key=f"held:{tag}")
                    await store.enqueue([holder])
                    async with jobs_trio.transaction(app_db):
                        await ship.enqueue(outbox, {"row": f"{tag}:plain"})
                        await ship.enqueue(outbox, {"row": f"{tag}:fresh"}, key=f"fresh:{tag}")
                        await ship.enqueue(outbox, {"row": f"{tag}:held"}, key=f"held:{tag}")
                    with pytest.raises(Boom):
                        async with jobs_trio.transaction(app_db):
                            await ship.enqueue(outbox, {"row": f"{tag}:rolled-back"})
                            raise Boom
                    expected.update({f"{tag}:plain": 1, f"{tag}:fresh": 1})
                    expected[f"{tag}:held"] = 0 if step in DECIDED else 1
                    expected[f"{tag}:rolled-back"] = 0

                    relay = relays[step]
                    inside = postgres_inside and step == "in-transaction"
                    if inside:
                        await sql(store, f'UPDATE "{where.schema}".test_stop SET stopped = true')
                    await relay.process.stdin.send_all(b"go\n")  # type: ignore[union-attr]
                    if inside:
                        await until(
                            "the relay's transaction to stop inside",
                            30,
                            functools.partial(stopped_inside, store, where.schema),
                        )
                    else:
                        await until(
                            f"the relay to stop {step}",
                            30,
                            functools.partial(_said, relay, f"PAUSED {step}"),
                        )
                    relay.process.kill()  # SIGKILL, at that step
                    await relay.process.wait()
                    kills[step] += 1
                    if inside:
                        await sql(store, f'UPDATE "{where.schema}".test_stop SET stopped = false')

                    # What it wrote runs; the key's holder finishes; retention deletes them all.
                    [claim] = await store.claim(["held"], 1, lease=30, worker_id="test")
                    await store.settle([Complete(claim.lease)])
                    await nothing_left(store_empty, "every job to run and be pruned")
                    # Only now does a relay take the rows again.
                    await nothing_left(outbox_moved, "the survivor to empty the outbox")
                    await nothing_left(all_run, "the survivor's jobs to run")
            # The decisions a relay killed after its delete left are swept once a lease old.
            await trio.sleep(LEASE)
            sweeper = jobs_trio.Relay(outbox, store, metrics=Metrics(CollectorRegistry()))
            await sweeper._one_pass()
            source = await app_db.outbox_source()
            assert await store.relay_decisions(source, before=store.now() + 1, limit=100) == []
        finally:
            for relay in started:
                if relay.process.returncode is None:
                    relay.process.kill()
            with trio.CancelScope(shield=True):
                for relay in started:
                    await relay.process.wait()

    counted = collections.Counter(runs)
    assert {row: counted[row] for row in expected} == expected
    assert set(counted) <= set(expected)
    committed = sum(1 for row in expected if not row.endswith("rolled-back"))
    print(
        f"\n{combination}: {ROUNDS} round(s), SIGKILLs {dict(kills)}; {committed} committed rows"
        f" -> {len(runs)} runs, each at most once ({sum(v == 1 for v in counted.values())} rows"
        f" ran once; {sum(1 for r, n in expected.items() if n == 0 and r.endswith('held'))}"
        f" held-key rows no-ops, their holders ran); {len(expected) - committed} rolled back"
        f" -> 0 runs"
    )


async def _said(relay: RelayProcess, line: str) -> bool:
    await trio.lowlevel.checkpoint()
    if relay.process.returncode is not None and not relay.said(line):
        pytest.fail(f"{relay.log.name} exited {relay.process.returncode}:\n{relay.log.read_text()}")
    return relay.said(line)
