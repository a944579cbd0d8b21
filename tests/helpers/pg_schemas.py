# Migrated PostgreSQL schemas reused across tests: emptied and reseeded at each open.
# Apart because migrating a schema costs ~0.2 s and the conformance suite opens hundreds.
from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers.postgres import PostgresDriver

# The tables a test may have written: every one of the schema but its migration records.
_TABLES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p')
  AND c.relname NOT IN ('migrations', 'schema_history')
"""


class SchemaPool:
    """Schemas of one test process, free or held by an open driver. A schema goes back free
    when its driver closes, whatever the test did to it: the next open empties it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._free: list[str] = []
        self._seeds: dict[str, list[tuple[str, str]]] = {}

    @contextlib.asynccontextmanager
    async def open(self, clock: Callable[[], float]) -> AsyncIterator[PostgresDriver]:
        fresh = not self._free
        schema = f"jt_{uuid.uuid4().hex[:12]}" if fresh else self._free.pop()
        try:
            async with open_driver(self.url, clock=clock, schema=schema, migrate=fresh) as driver:
                assert isinstance(driver, PostgresDriver)
                if fresh:
                    self._seeds[schema] = await _seeded_rows(driver)
                else:
                    await _reset(driver, self._seeds[schema])
                yield driver
        finally:
            if schema in self._seeds:
                self._free.append(schema)

    def drop_all(self) -> None:
        """Drop every schema this process made (at the end of its session)."""

        async def drop() -> None:
            for schema in self._seeds:
                async with open_driver(self.url, schema=schema, drop_schema_on_close=True):
                    pass

        if self._seeds:
            trio.run(drop)
        self._seeds.clear()
        self._free.clear()


async def _seeded_rows(driver: PostgresDriver) -> list[tuple[str, str]]:
    # Per table, the rows its migrations seeded (fleet_stats, prune_turn, outbox_source): a
    # reused schema opens as fresh as a migrated one, without paying for the migration.
    async def read(conn: Any) -> list[tuple[str, str]]:
        seeds = []
        for (name,) in await conn.fetch(_TABLES, driver.schema):
            table = f'"{driver.schema}"."{name}"'
            rows = await conn.fetchval(f"SELECT coalesce(json_agg(t), '[]')::text FROM {table} t")
            seeds.append((name, rows))
        return seeds

    result: list[tuple[str, str]] = await driver.bridge.run(read, what="reading seeded rows")
    return result


async def _reset(driver: PostgresDriver, seeds: list[tuple[str, str]]) -> None:
    schema = driver.schema
    # One round trip: DELETE (tiny tables empty far faster than TRUNCATE makes new files),
    # foreign keys off for this transaction so the order of tables does not matter.
    batch = ["SET LOCAL session_replication_role = replica"]
    for name, rows in seeds:
        table = f'"{schema}"."{name}"'
        batch.append(f"DELETE FROM {table}")
        if rows != "[]":
            batch.append(
                f"INSERT INTO {table} OVERRIDING SYSTEM VALUE"
                f" SELECT * FROM json_populate_recordset(null::{table}, $seed${rows}$seed$)"
            )

    async def reset(conn: Any) -> None:
        await conn.execute(";\n".join(batch))

    await driver.bridge.run(reset, what="emptying a reused schema", transaction=True)
