# Schema migrations for the PostgreSQL driver: numbered SQL files applied in order under an
# advisory lock, and the check a driver makes on open. Apart because `jobs-trio migrate` runs
# it without a driver, and because it is the only code that changes the schema.
from __future__ import annotations

import functools
import time

from .._core.errors import ConfigError, SchemaVersionError
from ._postgres_bridge import Bridge, open_bridge, sole_error
from ._postgres_plan import Plan, Query, fetch_on, run_plan_async
from ._postgres_pool import Connection
from ._postgres_sql import Statements, load_statements


async def migrate(url: str, *, schema: str = "jobs_trio") -> list[int]:
    """Bring ``schema`` up to date; answer the versions this call applied (none when another
    process got there first)."""
    statements = load_statements(schema)
    with sole_error():
        async with open_bridge(
            url, pool_size=1, application_name=f"jobs_trio:{schema}:migrate"
        ) as bridge:
            return await apply_migrations(bridge, statements)


async def apply_migrations(bridge: Bridge, sql: Statements) -> list[int]:
    async def apply(conn: Connection) -> list[int]:
        # A second migrator waits on the lock as long as the first takes, and an index built
        # over a deep table takes what it takes: the pool's bounds are lifted here, for this
        # transaction only.
        await conn.execute(sql["unbounded_waits"])
        # The lock first, for the whole transaction: a second migrator waits here, then finds
        # every version recorded and applies nothing.
        await conn.execute(sql["migration_lock"], sql.migration_lock_key)
        await conn.execute(sql["create_schema"])
        await conn.execute(sql["create_migrations_table"])
        recorded = {row["version"] for row in await conn.fetch(sql["applied_versions"])}
        _refuse_newer(sql, recorded)
        applied = []
        for migration in sql.migrations:
            if migration.version in recorded:
                continue
            await conn.execute(migration.sql)
            await conn.execute(sql["record_migration"], migration.version, time.time())
            applied.append(migration.version)
        return applied

    # Unbounded: a migration lifts the statement timeout for its transaction (an index built
    # over a large table may take minutes), so no answer bound can be derived from it.
    return await bridge.run(
        apply, what=f"migrating schema {sql.schema!r}", transaction=True, bounded=False
    )


async def check_migrated(bridge: Bridge, sql: Statements) -> None:
    """Refuse to open on a schema that is missing, behind, or ahead of this code."""

    async def read(conn: Connection) -> set[int] | None:
        recorded: set[int] | None = await run_plan_async(
            recorded_plan(sql), functools.partial(fetch_on, conn)
        )
        return recorded

    judge_schema(sql, await bridge.run(read, what=f"checking schema {sql.schema!r}"))


def recorded_plan(sql: Statements) -> Plan:
    """The migrations recorded in the schema (None: it has no migrations table), as a plan any
    client runs (a producer checks the schema it writes to the same way)."""
    [(exists,)] = yield Query(sql["migrations_table_exists"], (sql.migrations_table,))
    if not exists:
        return None
    rows = yield Query(sql["applied_versions"], ())
    return {row[0] for row in rows}


def judge_schema(sql: Statements, recorded: set[int] | None) -> None:
    """Refuse a schema whose recorded migrations (``recorded_plan``'s answer) are missing,
    behind, or ahead of this code."""
    if recorded is None:
        raise ConfigError(
            f"schema {sql.schema!r} has no jobs_trio tables: the database was never migrated",
            fix=f"run `jobs-trio migrate --db URL` (schema {sql.schema!r}) once per deploy, or "
            "open the driver with migrate=True",
        )
    _refuse_newer(sql, recorded)
    missing = sorted(m.version for m in sql.migrations if m.version not in recorded)
    if missing:
        raise ConfigError(
            f"schema {sql.schema!r} lacks migrations {missing} that this version of jobs_trio "
            "needs",
            fix="run `jobs-trio migrate --db URL` before starting workers of this version, or "
            "open the driver with migrate=True",
        )


def _refuse_newer(sql: Statements, recorded: set[int]) -> None:
    unknown = sorted(v for v in recorded if v > sql.newest_version)
    if unknown:
        raise SchemaVersionError(
            f"schema {sql.schema!r} was migrated by a newer jobs_trio (migrations {unknown}; "
            f"this code knows up to {sql.newest_version})",
            fix="upgrade jobs_trio here to the version that migrated the database; an older "
            "version must not write to a schema it does not understand",
        )
