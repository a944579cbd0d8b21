# Index builds on the tables the fleet writes, on PostgreSQL (issue 49): a `-- transaction: none`
# migration builds CONCURRENTLY outside a transaction on a large table, so the fleet's writes
# go on while it builds; an index a cut build left INVALID is dropped and built again; and a
# second migration arriving meanwhile waits its turn without the two waiting on each other. A
# "large" table is any here (SMALL_TABLE_BYTES set to 0), and a long build is an index whose
# expression sleeps a few milliseconds a row.
from __future__ import annotations

import logging
import re
from pathlib import Path
from urllib.parse import urlparse

import attrs
import pytest
import trio

import jobs_trio
from jobs_trio._core.errors import ConfigError
from jobs_trio.drivers._migration_files import Migration
from jobs_trio.drivers._open_driver import migrate_database
from tests.conftest import require_postgres
from tests.helpers.pgbouncer_process import MISSING, PGBOUNCER, open_pgbouncer, through

pytestmark = pytest.mark.postgres

pytest.importorskip("trio_asyncio")
pytest.importorskip("asyncpg")

from jobs_trio.drivers import _postgres_index_builds  # noqa: E402
from jobs_trio.drivers._postgres_migrate import apply_migrations  # noqa: E402
from jobs_trio.drivers._postgres_sql import Statements, load_statements  # noqa: E402
from jobs_trio.drivers.postgres import PostgresDriver, open_postgres_driver  # noqa: E402
from tests.drivers.test_postgres_driver import Admin, driver_and_admin, open_admin  # noqa: E402
from tests.drivers.test_postgres_migration_locks import Fleet, blocked_tries  # noqa: E402

FOLDER = Path(_postgres_index_builds.__file__).parent / "postgres_migrations"
# The migrations 0.1 shipped (0001-0010) built their indexes in a transaction; from the first
# after it, an index on a table an earlier migration made is built CONCURRENTLY.
FIRST_AFTER_0_1 = 11
# The next release's index, built over every job at ROW_SECONDS a row (IMMUTABLE: PostgreSQL
# calls it once a row per scan, and once for each row written while the index exists).
ROW_SECONDS = 0.005
ROWS = 100
POOL_LOCK_TIMEOUT = 0.3


def every_table_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set once the test's schema is migrated: built CONCURRENTLY, its fresh indexes would
    wait for every older transaction on the server (other tests' too)."""
    monkeypatch.setattr(_postgres_index_builds, "SMALL_TABLE_BYTES", 0)


def forgotten(sql: Statements, *versions: int) -> str:
    """What makes a schema as the previous release left it: the indexes of ``versions`` gone,
    their records too."""
    drops = [
        f'DROP INDEX IF EXISTS "{sql.schema}".{build.index};'
        for m in sql.migrations
        if m.version in versions
        for build in _postgres_index_builds.index_builds(m)
    ]
    listed = ", ".join(map(str, versions))
    return (
        " ".join(drops) + f' DELETE FROM "{sql.schema}".schema_history WHERE version IN ({listed})'
    )


async def index_state(admin: Admin, schema: str, index: str) -> bool | None:
    valid: bool | None = await admin.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", f'"{schema}".{index}'
    )
    return valid


def test_an_index_on_an_existing_table_is_built_concurrently() -> None:
    """The rule every migration after 0.1's keeps: a build over a table an earlier migration
    made (one the fleet may have filled) never holds the fleet's writes."""
    made: set[str] = set()
    for path in sorted(FOLDER.glob("*.sql")):
        version, sql = int(path.name[:4]), path.read_text()
        made |= set(re.findall(r"CREATE TABLE \{schema\}\.(\w+)", sql))
        for table in re.findall(
            r"CREATE (?:UNIQUE )?INDEX\s+(?!CONCURRENTLY)\w+ ON \{schema\}\.(\w+)", sql
        ):
            if version >= FIRST_AFTER_0_1:
                here = re.findall(r"CREATE TABLE \{schema\}\.(\w+)", sql)
                assert table in here, f"{path.name} builds an index on {table} in a transaction"
    assert {"jobs", "events"} <= made


def test_a_migration_outside_a_transaction_holds_index_builds_only() -> None:
    sql = load_statements("jobs_trio")
    outside = [m for m in sql.migrations if not m.transaction]
    assert {m.version for m in outside} >= {18, 21}
    for bad in (
        "CREATE INDEX CONCURRENTLY jobs_x ON jobs (id);",  # no IF NOT EXISTS: not re-runnable
        "CREATE INDEX IF NOT EXISTS jobs_x ON jobs (id);",  # would block the fleet
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_x ON jobs (id); ALTER TABLE jobs ADD x int;",
    ):
        with pytest.raises(RuntimeError, match="may hold only"):
            _postgres_index_builds.index_builds(Migration(9001, "9001_x.sql", bad, None, False))
    [build] = _postgres_index_builds.index_builds(outside[0])
    assert "CONCURRENTLY" not in build.plain and build.table == '"jobs_trio".jobs'


def slow_index(driver: PostgresDriver) -> Statements:
    """The driver's statements and the next release's index over jobs: ROW_SECONDS a row."""
    sql = driver._sql
    slow = Migration(
        9001,
        "9001_slow_index.sql",
        f'-- transaction: none\nCREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_slow ON "{sql.schema}"'
        f'.jobs ("{sql.schema}".slow_key(id));',
        None,
        False,
    )
    return attrs.evolve(sql, migrations=[*sql.migrations, slow])


async def test_an_index_built_on_a_large_table_holds_no_write(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = require_postgres()
    fleet = Fleet()
    registry, work = fleet.registry()
    async with driver_and_admin(url, pg_schema, lock_timeout=POOL_LOCK_TIMEOUT) as (
        driver,
        admin,
    ):
        every_table_large(monkeypatch)
        await admin.execute(
            f'CREATE FUNCTION "{pg_schema}".slow_key(t text) RETURNS text LANGUAGE plpgsql'
            f" IMMUTABLE AS $$ BEGIN PERFORM pg_sleep({ROW_SECONDS}); RETURN t; END $$"
        )
        fleet.enqueued += await work.enqueue_many(driver, [{}] * ROWS)
        async with (
            jobs_trio.open_worker(driver, registry, lifecycle=None, poll_interval=0.05),
            trio.open_nursery() as nursery,
        ):
            stop = trio.Event()
            nursery.start_soon(fleet.enqueue_until, stop, lambda: work.enqueue(driver, {}))
            began = trio.current_time()
            applied = await apply_migrations(driver.bridge, slow_index(driver))
            took = trio.current_time() - began
            stop.set()
            with trio.fail_after(30):
                while len(fleet.done_at) < len(fleet.enqueued):
                    await trio.sleep(0.05)
        valid = await index_state(admin, pg_schema, "jobs_slow")
    sent = zip(fleet.sent_at, fleet.enqueue_seconds, strict=True)
    during = [s for t, s in sent if began <= t < began + took]
    assert applied == [9001] and valid is True
    # The build scanned ROWS rows at ROW_SECONDS each (a plain build held every write as long,
    # past the pool's lock timeout); the application enqueued all along, and nothing failed.
    assert took >= ROWS * ROW_SECONDS
    assert fleet.failed == [] and len(during) >= 3
    assert set(fleet.runs.values()) == {1} and set(fleet.runs) == set(fleet.enqueued)


async def test_an_index_a_cut_build_left_invalid_is_built_again(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = require_postgres()
    async with (
        open_postgres_driver(url, schema=pg_schema, migrate=True, drop_schema_on_close=True) as d,
        open_admin(url) as admin,
    ):
        await d.enqueue([jobs_trio.testing.conformance.helpers.new_job() for _ in range(2)])
        for large in (False, True):
            if large:
                every_table_large(monkeypatch)  # built CONCURRENTLY, outside a transaction
            await admin.execute(forgotten(d._sql, 18))
            # A build cut short leaves its index INVALID under the migration's own name: here
            # a unique one that met two equal names (as a cancel or a lock timeout leaves it).
            with pytest.raises(Exception, match="could not create unique index"):
                await admin.execute(
                    f'CREATE UNIQUE INDEX CONCURRENTLY jobs_key_created ON "{pg_schema}".jobs'
                    " (name)"
                )
            assert await index_state(admin, pg_schema, "jobs_key_created") is False
            assert await apply_migrations(d.bridge, d._sql) == [18]
            assert await index_state(admin, pg_schema, "jobs_key_created") is True
            definition = await admin.fetchval(
                "SELECT pg_get_indexdef(to_regclass($1))", f'"{pg_schema}".jobs_key_created'
            )
            assert "(key, created_at) WHERE (key IS NOT NULL)" in definition
            assert "UNIQUE" not in definition


async def test_a_build_and_other_migrations_never_wait_on_each_other(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A build CONCURRENTLY waits for every transaction older than its last phase. A second
    migration of this release queued for a lock the build's session held would be one, waiting
    for that session: it tries the lock instead, and again later. 0.1's migration does queue
    for the migration lock, without a bound: the build holds a lock of its own."""
    url = require_postgres()
    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with (
        open_postgres_driver(url, schema=pg_schema, migrate=True, drop_schema_on_close=True) as d,
        open_admin(url) as writer,
        open_admin(url) as old_release,
        open_admin(url) as admin,
    ):
        every_table_large(monkeypatch)
        await admin.execute(forgotten(d._sql, 18, 21))
        # A write to jobs left open: the build waits for it before it scans, long enough for the
        # other migrations to arrive, whose snapshots are then older than the build's last.
        await writer.execute("BEGIN")
        await writer.execute(
            f'INSERT INTO "{pg_schema}".jobs (id, name, queue, state, payload, priority,'
            " attempts, max_attempts, run_at, created_at, updated_at)"
            " VALUES ('w', 'w', 'w', 'completed', 'null', 0, 1, 1, 0, 0, 0)"
        )
        results: dict[str, list[int]] = {}

        async def migrate(name: str) -> None:
            results[name] = await apply_migrations(d.bridge, d._sql)

        async def migrate_as_0_1() -> None:
            # 0.1's migration takes the migration lock with no lock timeout, then finds its
            # own migrations applied.
            await old_release.execute("BEGIN")
            await old_release.execute("SET LOCAL lock_timeout = 0")
            await old_release.fetchval(
                "SELECT pg_advisory_xact_lock($1)", d._sql.migration_lock_key
            )
            await old_release.execute("COMMIT")
            results["0.1"] = []

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(migrate, "first")
                while not await admin.fetchval_now(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX CONC%'"
                    " AND wait_event_type = 'Lock'"
                ):
                    await trio.sleep(0.05)
                nursery.start_soon(migrate_as_0_1)
                nursery.start_soon(migrate, "second")
                while "index build lock" not in str(blocked_tries(caplog)):
                    await trio.sleep(0.05)
                await writer.execute("COMMIT")
        assert await index_state(admin, pg_schema, "jobs_key_created") is True
        history = await admin.fetch(
            f'SELECT version FROM "{pg_schema}".schema_history WHERE version IN (18, 21)'
        )
    # Each applied once, by one or the other (the second may take 21 once 18 is done).
    assert results["first"][0] == 18 and sorted(results["first"] + results["second"]) == [18, 21]
    assert sorted(r["version"] for r in history) == [18, 21]
    # The second migration named what it waited for: the build (and 0.1's migration, if it
    # came by meanwhile).
    said = " ".join(fields["held_by"] for fields in blocked_tries(caplog))
    assert "holding the index build lock" in said and "CREATE INDEX CONCURRENTLY" in said


@pytest.mark.slow
@pytest.mark.skipif(PGBOUNCER is None, reason=MISSING)
async def test_through_pgbouncer_in_transaction_mode_the_build_goes_to_the_server(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PgBouncer in transaction mode keeps no session, and a build CONCURRENTLY needs one (its
    lock, its timeouts): it goes to the direct address LISTEN uses, and without one the
    migration says so. The migrations in a transaction go through PgBouncer, their timeouts
    set inside it."""
    direct = require_postgres()
    server = urlparse(direct)
    async with (
        open_pgbouncer(tmp_path / "pgbouncer", direct, "transaction") as bouncer,
        open_postgres_driver(
            direct, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ) as driver,
        open_admin(direct) as admin,
    ):
        every_table_large(monkeypatch)
        await admin.execute(forgotten(driver._sql, 18, 21))
        pooled = through(direct, bouncer, "pgbouncer=transaction")
        with pytest.raises(ConfigError) as refused:
            await migrate_database(pooled, schema=pg_schema)
        listen = f"listen_host={server.hostname}&listen_port={server.port or 5432}"
        applied = await migrate_database(f"{pooled}&{listen}", schema=pg_schema)
        assert await index_state(admin, pg_schema, "jobs_key_created") is True
    assert "builds an index CONCURRENTLY" in refused.value.cause
    assert "listen_host" in refused.value.fix
    assert applied == [18, 21]
