# This release against the next release's schema (issue 49), on SQLite and PostgreSQL: a
# migration of the next release that only adds (a column, a table) leaves the schema at the
# compatibility level this release works with, and this release starts and runs jobs on it; a
# migration that raises the level is refused, by this release with the way out, and by the mark
# 0.1's strict check reads. The next release is played by the migrators themselves, given one
# more migration file and that release's level.
from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import jobs_trio
from jobs_trio._core.errors import SchemaVersionError
from jobs_trio._core.records import JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers import _sqlite_migrate
from jobs_trio.drivers._migration_files import COMPATIBILITY_LEVEL, Migration, declared_level
from jobs_trio.drivers._open_driver import migrate_database, open_driver
from jobs_trio.drivers._schema_compatibility import MARK_FOR_0_1
from tests.conftest import require_postgres

NEXT = "9.9.0"  # the release the test plays

# What each plays: a column and a table the next release added (this release never reads them),
# and a rename of a column this release writes, declared as the break it is.
ADDITIVE = """-- The next release's notes on a job, and a table of its own.
ALTER TABLE {schema}jobs ADD COLUMN next_note text DEFAULT 'x';
CREATE TABLE {schema}next_things (id integer PRIMARY KEY, what text);
"""
BREAKING = """-- The next release reads errors from a column of another name.
-- compatibility-level: 2
ALTER TABLE {schema}jobs RENAME COLUMN last_error TO error_text;
"""


def next_migration(version: int, sql: str, schema: str) -> Migration:
    text = sql.replace("{schema}", f'"{schema}".' if schema else "")
    name = f"{version:04d}_next.sql"
    return Migration(version, name, text, declared_level(name, text))


@attrs.frozen
class Database:
    """One database of a driver, and how the next release migrates it."""

    url: str
    schema: str  # "" for SQLite
    migrate_next: Callable[[Migration, int], Awaitable[None]]
    mark_for_0_1: Callable[[], Awaitable[int]]  # what 0.1's strict check reads


@contextlib.asynccontextmanager
async def sqlite_database(tmp_path: Path) -> AsyncIterator[Database]:
    path = tmp_path / "jobs.db"
    url = f"sqlite:///{path}"

    async def migrate_next(migration: Migration, works_with: int) -> None:
        known = [*_sqlite_migrate.KNOWN, migration]
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            _sqlite_migrate._migrate(
                conn, str(path), known=known, works_with=works_with, release=NEXT
            )
            conn.execute("COMMIT")

    async def mark() -> int:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            return version

    yield Database(url, "", migrate_next, mark)


@contextlib.asynccontextmanager
async def postgres_database(pg_schema: str) -> AsyncIterator[Database]:
    url = require_postgres()
    from jobs_trio.drivers._postgres_migrate import apply_migrations
    from jobs_trio.drivers._postgres_open import open_bridge
    from jobs_trio.drivers._postgres_sql import load_statements
    from tests.drivers.test_postgres_driver import open_admin

    async with open_admin(url, drop=pg_schema) as admin:

        async def migrate_next(migration: Migration, works_with: int) -> None:
            statements = load_statements(pg_schema)
            statements = attrs.evolve(statements, migrations=[*statements.migrations, migration])
            async with open_bridge(url, pool_size=1, application_name="next") as bridge:
                await apply_migrations(bridge, statements, works_with=works_with, release=NEXT)

        async def mark() -> int:
            versions = await admin.fetch(f'SELECT version FROM "{pg_schema}".migrations')
            return max(row["version"] for row in versions)

        yield Database(url, pg_schema, migrate_next, mark)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema: str
) -> AsyncIterator[Database]:
    opened = (
        sqlite_database(tmp_path) if request.param == "sqlite" else postgres_database(pg_schema)
    )
    async with opened as database:
        yield database


def options(database: Database) -> dict[str, Any]:
    return {"schema": database.schema} if database.schema else {}


registry = jobs_trio.Registry()


@registry.job("levels.echo", attempts=1)
async def echo(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    return payload


async def runs_jobs(driver: Driver) -> None:
    """Jobs enqueued, claimed, run and settled by this release's worker, with an error kept."""
    ids = await echo.enqueue_many(driver, [{"n": n} for n in range(3)])
    async with jobs_trio.open_worker(driver, registry, lifecycle=None, poll_interval=0.05):
        with trio.fail_after(20):
            while True:
                records = [await driver.get(job_id) for job_id in ids]
                if all(r is not None and r.state is JobState.COMPLETED for r in records):
                    break
                await trio.sleep(0.02)
    assert [r.result for r in records if r] == [{"n": n} for n in range(3)]


def next_version() -> int:
    return _sqlite_migrate.SCHEMA_VERSION + 7000  # past any migration of this release


async def test_this_release_runs_on_the_next_releases_additive_schema(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    assert await migrate_database(database.url, **options(database)) is not None
    version = next_version()
    await database.migrate_next(next_migration(version, ADDITIVE, database.schema), 1)
    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with open_driver(database.url, **options(database)) as driver:
        await runs_jobs(driver)
    [ahead] = [r for r in caplog.records if getattr(r, "event", None) == "jobs.schema.ahead"]
    assert ahead.fields["migrations"] == str(version) and ahead.fields["by"] == NEXT  # type: ignore[attr-defined]
    # Its own migrate leaves the next release's schema as it is, and so does a worker's open
    # with migrate=True.
    assert await migrate_database(database.url, **options(database)) == []
    async with open_driver(database.url, migrate=True, **options(database)) as driver:
        await runs_jobs(driver)
    # 0.1's strict check finds only what it knows: 0.1 starts against it too.
    assert await database.mark_for_0_1() < MARK_FOR_0_1


async def test_this_release_refuses_a_schema_the_next_release_broke(database: Database) -> None:
    await migrate_database(database.url, **options(database))
    version = next_version()
    breaking = next_migration(version, BREAKING, database.schema)
    assert breaking.level == COMPATIBILITY_LEVEL + 1
    await database.migrate_next(breaking, breaking.level)
    for migrate in (False, True):
        with pytest.raises(SchemaVersionError) as refused:
            async with open_driver(database.url, migrate=migrate, **options(database)):
                pass  # pragma: no cover
        cause, fix = refused.value.cause, refused.value.fix
        assert f"compatibility level {breaking.level}" in cause
        assert f"migration {version} ({breaking.name}, applied by jobs_trio {NEXT})" in cause
        assert f"works with level {COMPATIBILITY_LEVEL} at most" in cause
        assert f"run jobs_trio {NEXT} or a later release here" in fix
        assert f"backup taken before migration {version}" in fix
        assert not refused.value.retryable
    with pytest.raises(SchemaVersionError):
        await migrate_database(database.url, **options(database))
    # And 0.1's record now holds a number past every migration, which 0.1 refuses.
    assert await database.mark_for_0_1() == MARK_FOR_0_1 + breaking.level


def test_a_level_is_declared_once_as_a_whole_number_from_2() -> None:
    assert declared_level("0001_a.sql", "CREATE TABLE a (id int);") is None
    assert declared_level("0001_a.sql", "-- why\n-- compatibility-level: 3\nDROP TABLE a;") == 3
    for bad in ("1", "two", "2\n-- compatibility-level: 3"):
        with pytest.raises(RuntimeError, match="compatibility-level: N"):
            declared_level("0001_a.sql", f"-- compatibility-level: {bad}\nSELECT 1;")
