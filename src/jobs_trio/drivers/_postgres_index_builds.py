# The migrations that build an index on a table the fleet writes (`-- transaction: none`): on a
# large table, CREATE INDEX CONCURRENTLY, which lets every read and write through while it builds
# but cannot run in a transaction. Apart because such a migration is applied statement by
# statement and must resume from any point it was cut at (an index a cut build left INVALID is
# dropped and built again), and because it alone decides how each index is built.
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import attrs

from ._migration_files import Migration, read_migrations
from ._postgres_pool import Connection
from ._postgres_sql import Statements

# What such a migration holds, and all it may hold: builds a second run skips once they are done.
# The index's name, and the table it is built on (as the filled statement names it, quoted
# schema and all: what to_regclass() reads).
_BUILD: Final = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)IF\s+NOT\s+EXISTS\s+([a-z_][a-z0-9_]*)"
    r"\s+ON\s+([^\s(]+)",
    re.IGNORECASE,
)

# Below this size a table's index is built in the migration's transaction, as any migration's
# statements are (a few hundred ms at most, under the migration's short lock timeout): a build
# CONCURRENTLY scans twice and waits three times for every transaction of the database older
# than it, which a fresh or small database need not pay (a test suite migrating schemas beside
# another's long transactions). On the 1,500,000-job table of bench/migration_index.py (about
# 600 MB) a plain build held the fleet's writes 2 s.
SMALL_TABLE_BYTES: Final = 8 * 1024 * 1024


@attrs.frozen
class IndexBuild:
    index: str
    table: str  # as the statement names it: '"jobs_trio".jobs'
    concurrently: str  # the statement as written
    plain: str  # the same without CONCURRENTLY, for a transaction


def index_builds(migration: Migration) -> tuple[IndexBuild, ...]:
    """The index builds of a `-- transaction: none` migration, each statement checked: it is
    re-run whole after an interruption, so it may hold only builds that skip an index already
    there (IF NOT EXISTS) and that never block the fleet (CONCURRENTLY)."""
    lines = [ln for ln in migration.sql.splitlines() if not ln.lstrip().startswith("--")]
    statements = [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
    builds = []
    for statement in statements:
        found = _BUILD.match(statement)
        if found is None:
            raise RuntimeError(
                f"{migration.name} runs outside a transaction (`-- transaction: none`) and holds"
                f" {statement[:80]!r}: such a migration may hold only `CREATE [UNIQUE] INDEX"
                " CONCURRENTLY IF NOT EXISTS name ON table ...` statements (re-run whole after"
                " an interruption, each must skip what is done); put anything else in a"
                " migration of its own"
            )
        start, end = found.span(1)
        builds.append(
            IndexBuild(
                index=found.group(2),
                table=found.group(3),
                concurrently=statement,
                plain=statement[:start] + statement[end:],
            )
        )
    if not builds:
        raise RuntimeError(f"{migration.name} runs outside a transaction and builds nothing")
    return tuple(builds)


async def all_small(conn: Connection, sql: Statements, builds: Sequence[IndexBuild]) -> bool:
    """Whether every table ``builds`` index is small enough to be indexed in a transaction."""
    for build in builds:
        size = await conn.fetchval(sql["table_bytes"], build.table)
        if size is None or size >= SMALL_TABLE_BYTES:
            return False
    return True


async def build_indexes(
    conn: Connection, sql: Statements, builds: Sequence[IndexBuild], *, concurrently: bool
) -> None:
    """Build each index that is not there, or that a cut build left INVALID (dropped first:
    kept up by every write and never read, and IF NOT EXISTS would skip it). ``concurrently``:
    on a session outside any transaction, under the session's migration lock (so no other
    migration is building it meanwhile); else inside the migration's transaction."""
    for one in builds:
        valid = await conn.fetchval(sql["index_valid"], sql.table(one.index))
        if valid is False:
            drop = "drop_index_concurrently" if concurrently else "drop_index"
            await conn.execute(sql[drop].replace("{index}", one.index))
        await conn.execute(one.concurrently if concurrently else one.plain)


for _migration in read_migrations("postgres_migrations"):
    if not _migration.transaction:
        index_builds(_migration)  # a statement it may not hold fails the import, not an upgrade
