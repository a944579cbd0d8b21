# Schema migrations for the PostgreSQL driver: numbered SQL files applied one transaction each,
# under an advisory lock and a short lock timeout retried with backoff (the fleet's statements
# never queue long behind one), and the check a driver makes on open. Apart because `jobs-trio
# migrate` runs it without a driver, and because it is the only code that changes the schema.
from __future__ import annotations

import enum
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import trio

from .._core.errors import ConfigError, RowLocked
from .._core.logs import log_event
from .._core.single_error import unwrap_single_error
from .._core.version import VERSION
from ._migration_files import COMPATIBILITY_LEVEL, Migration
from ._postgres_bridge import Bridge, NameHolders
from ._postgres_index_builds import all_small, build_indexes, index_builds
from ._postgres_locks import LockHolder, described, lock_holders
from ._postgres_open import open_bridge
from ._postgres_plan import Plan, Query, fetch_on, run_plan_async
from ._postgres_pool import Connection
from ._postgres_sql import Statements, load_statements
from ._schema_compatibility import (
    MARK_FOR_0_1,
    Applied,
    Verdict,
    judge,
    level_after,
    mark_for_0_1,
    note_ahead,
    refuse_incompatible,
)

T = TypeVar("T")

# How long each lock a migration takes may be waited for. Every statement the fleet sends to a
# table queues behind a migration waiting for that table's exclusive lock (PostgreSQL grants
# locks in order), so this is the longest a worker's or an enqueue's statement waits for a
# migration that cannot start: well inside their own lock timeout (2 s by default).
MIGRATION_LOCK_TIMEOUT: Final = 0.5
# How long a migration keeps trying before it gives up, naming what held it.
MIGRATION_WAIT: Final = 600.0
# The pause after the first lock timeout, doubled after each up to the cap (with a fifth of
# jitter, so that two migrators do not knock in step): a migration behind a long reader blocks
# the fleet for MIGRATION_LOCK_TIMEOUT in every 5.5 s at most.
_BACKOFF_FIRST: Final = 0.5
_BACKOFF_CAP: Final = 5.0

# The longest lock_timeout PostgreSQL takes (an int of milliseconds).
_MAX_LOCK_TIMEOUT_MS: Final = 2**31 - 1


class _Outside(enum.Enum):
    """`apply`'s answer for a migration that builds an index on a large table: built on a
    session of its own, outside any transaction."""

    OUTSIDE = "outside"


OUTSIDE: Final = _Outside.OUTSIDE

# 0.1's newest migration: its record (`migrations`) holds 0001-0010 and nothing past them while
# the schema stays one 0.1 can use (_schema_compatibility.MARK_FOR_0_1).
NEWEST_IN_0_1: Final = 10


def holders_namer(sql: Statements) -> NameHolders:
    """How the bridge names the sessions holding a lock on this schema's tables."""
    statement, schema = sql["lock_holders"], sql.schema

    async def name(conn: Connection, waited: float) -> list[LockHolder]:
        return await lock_holders(conn, statement, schema, max(0.0, waited))

    return name


async def migrate(
    url: str,
    *,
    schema: str = "jobs_trio",
    lock_timeout: float = MIGRATION_LOCK_TIMEOUT,
    wait: float = MIGRATION_WAIT,
) -> list[int]:
    """Bring ``schema`` up to date; answer the versions this call applied (none when another
    process got there first). Each lock is waited for ``lock_timeout`` seconds at most, then
    tried again later, for up to ``wait`` seconds in all."""
    statements = load_statements(schema)
    with unwrap_single_error():
        async with open_bridge(
            url,
            pool_size=1,
            application_name=f"jobs_trio:{schema}:migrate",
            name_holders=holders_namer(statements),
        ) as bridge:
            return await apply_migrations(bridge, statements, lock_timeout=lock_timeout, wait=wait)


async def apply_migrations(
    bridge: Bridge,
    sql: Statements,
    *,
    lock_timeout: float = MIGRATION_LOCK_TIMEOUT,
    wait: float = MIGRATION_WAIT,
    works_with: int = COMPATIBILITY_LEVEL,
    release: str = VERSION,
) -> list[int]:
    """Apply the migrations ``sql`` holds that the schema lacks, each in a transaction of its
    own (its locks held only as long as it runs), or an index build on a large table outside
    any (_postgres_index_builds), and answer their versions. ``works_with`` and ``release`` are
    this release's (another's, in a test that plays the next release)."""
    where = f"schema {sql.schema!r}"
    deadline = trio.current_time() + wait

    async def retried(attempt: Callable[[], Awaitable[T]], what: str) -> T:
        return await _retried(attempt, what, where, lock_timeout, deadline)

    def in_transaction(
        op: Callable[[Connection], Awaitable[T]], what: str
    ) -> Callable[[], Awaitable[T]]:
        async def attempt() -> T:
            return await bridge.run(
                op,
                what=f"{what} of {where}",
                transaction=True,
                bounded=False,
                lock_wait=lock_timeout,
            )

        return attempt

    async def begin(conn: Connection) -> tuple[Verdict, list[Applied]]:
        """The waits, the migration lock, and what the schema holds now (read under the lock:
        another migrator may have applied what this one was about to)."""
        await conn.execute(sql["migration_waits"], _milliseconds(lock_timeout))
        key = sql.migration_lock_key
        if not await conn.fetchval(sql["migration_lock"], key):
            raise await _lock_taken(conn, sql, key, "the migration lock")
        return await _judged(conn, sql, works_with, where)

    async def prepare(conn: Connection) -> Verdict:
        verdict, applied = await begin(conn)
        await conn.execute(sql["create_schema"])
        await conn.execute(sql["create_migrations_table"])
        await conn.execute(sql["create_schema_history"])
        # A schema 0.1 (or a build before the history) migrated: its record, into the history
        # (what is there already stays as it is).
        for known in applied:
            await conn.execute(
                sql["record_history"],
                known.version,
                known.name,
                known.level,
                known.applied_at or 0.0,
                known.applied_by,
            )
        await _keep_0_1s_record(conn, sql, verdict.level)
        return verdict

    async def apply(conn: Connection, migration: Migration) -> int | _Outside | None:
        """The schema's level once ``migration`` is applied; None if another migrator applied
        it meanwhile; OUTSIDE if it builds an index on a large table, which is built outside
        any transaction."""
        verdict, _ = await begin(conn)
        if migration not in verdict.missing:
            return None
        if migration.transaction:
            await conn.execute(migration.sql)
        else:
            builds = index_builds(migration)
            if not await all_small(conn, sql, builds):
                return OUTSIDE
            await build_indexes(conn, sql, builds, concurrently=False)
        return await _record(conn, sql, migration, verdict.level, release)

    async def outside(session: Connection, migration: Migration, left: float) -> int | None:
        """``apply`` on a session of its own outside any transaction, holding the index build
        lock as long as it lasts: the builds CONCURRENTLY, each lock waited for ``left`` seconds
        (a build blocks nobody while it waits), then the record in a transaction. Run on the
        asyncio side."""
        import asyncpg

        await session.execute(sql["index_session"], _milliseconds(left))
        key = sql.index_build_lock_key
        if not await session.fetchval(sql["index_build_lock"], key):
            raise await _lock_taken(session, sql, key, "the index build lock")
        verdict, _ = await _judged(session, sql, works_with, where)
        if migration not in verdict.missing:
            return None
        try:
            await build_indexes(session, sql, index_builds(migration), concurrently=True)
        except asyncpg.exceptions.LockNotAvailableError as exc:
            # A cut build's index is left INVALID: the next try drops it and builds again.
            holders = await lock_holders(session, sql["snapshot_holders"], sql.schema, left)
            raise RowLocked(
                f"its index build CONCURRENTLY waited {left:.1f} s (what was left of the"
                f" wait) for older transactions to end: [55P03] {exc}",
                holders=tuple(holders),
            ) from exc
        async with session.transaction():
            return await _record(session, sql, migration, verdict.level, release)

    def on_a_session(migration: Migration) -> Callable[[], Awaitable[int | None]]:
        async def attempt() -> int | None:
            if bridge.pooler.session_url is None:
                raise ConfigError(
                    f"migration {migration.name} of {where} builds an index CONCURRENTLY,"
                    " which needs a session of its own, and PgBouncer in transaction mode keeps"
                    " none",
                    fix="give the server's own address for it (?listen_host=&listen_port= in"
                    " the URL, as for LISTEN), or run `jobs-trio migrate` against the server"
                    " directly",
                )
            left = max(lock_timeout, deadline - trio.current_time())
            session = await bridge.connect(purpose="index")
            try:
                return await bridge.call(
                    functools.partial(outside, session, migration, left),
                    what=f"migration {migration.name} of {where}",
                )
            finally:
                await bridge.close_connection(session)

        return attempt

    verdict = await retried(in_transaction(prepare, "preparing"), "preparing")
    applied = []
    for migration in verdict.missing:

        async def apply_this(
            conn: Connection, migration: Migration = migration
        ) -> int | _Outside | None:
            return await apply(conn, migration)

        what = f"migration {migration.name}"
        started = trio.current_time()
        level = await retried(in_transaction(apply_this, what), what)
        if level is OUTSIDE:
            level = await retried(on_a_session(migration), what)
        if level is not None:
            # Said once it has committed (the crossing returned), with what it took, the
            # tries behind a lock included.
            log_event(
                "jobs.migrate.applied",
                logging.INFO,
                where=where,
                migration=migration.name,
                compatibility_level=level,
                seconds=round(trio.current_time() - started, 3),
            )
            applied.append(migration.version)
    return applied


async def _judged(
    conn: Connection, sql: Statements, works_with: int, where: str
) -> tuple[Verdict, list[Applied]]:
    applied = await _read_applied(conn, sql) or []
    verdict = judge(sql.migrations, applied, works_with=works_with)
    refuse_incompatible(verdict, where, works_with=works_with)
    return verdict, applied


async def _record(
    conn: Connection, sql: Statements, migration: Migration, level: int, release: str
) -> int:
    """Record ``migration`` as applied to a schema that was at ``level``; its level now."""
    level = level_after(level, migration)
    now = time.time()
    await conn.execute(
        sql["record_history"], migration.version, migration.name, level, now, release
    )
    if migration.version <= NEWEST_IN_0_1:
        await conn.execute(sql["record_migration"], migration.version, now)
    await _keep_0_1s_record(conn, sql, level)
    return level


async def _lock_taken(conn: Connection, sql: Statements, key: int, lock: str) -> RowLocked:
    """The error for an advisory ``lock`` (of ``key``) another session holds, naming it."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF  # pg_locks shows the key as two oids
    holders = await lock_holders(
        conn, sql["advisory_lock_holders"], unsigned >> 32, unsigned & 0xFFFF_FFFF, lock
    )
    return RowLocked(f"another migration holds {lock}", holders=tuple(holders))


async def _retried(
    attempt: Callable[[], Awaitable[T]],
    what: str,
    where: str,
    lock_timeout: float,
    deadline: float,
) -> T:
    """``attempt``, tried again after a pause each time a lock it needs was held past
    ``lock_timeout``, each try's holders named in the log, until ``deadline``."""
    started = trio.current_time()
    tries = 0
    while True:
        tries += 1
        try:
            return await attempt()
        except RowLocked as locked:
            holders: Sequence[Any] = locked.holders
            now = trio.current_time()
            said = described([h for h in holders if isinstance(h, LockHolder)])
            if now >= deadline:
                raise RowLocked(
                    f"{what} of {where} waited {now - started:.1f} s for its locks"
                    f" ({tries} tries) and gave up: {said}",
                    fix="end or wait out that transaction (SELECT pg_terminate_backend(pid)"
                    " ends it), then migrate again; or give the migration longer (`jobs-trio"
                    " migrate --wait SECONDS`)",
                    holders=locked.holders,
                ) from locked
            pause = min(deadline - now, _pause(tries))
            log_event(
                "jobs.migrate.blocked",
                logging.WARNING,
                where=where,
                migration=what,
                tries=tries,
                waited=round(now - started, 1),
                retry_in=round(pause, 2),
                pids=",".join(str(h.pid) for h in holders if isinstance(h, LockHolder)),
                held_by=said,
                why="a lock it needs was held by another session (a table's, past its"
                f" {lock_timeout:g} s lock timeout, or the migration lock); it let the fleet's"
                " statements through and tries again",
            )
            await trio.sleep(pause)


def _milliseconds(seconds: float) -> str:
    """A lock timeout as set_config takes it."""
    return f"{min(_MAX_LOCK_TIMEOUT_MS, round(seconds * 1000))}ms"


def _pause(tries: int) -> float:
    grown = _BACKOFF_FIRST * 2.0 ** (tries - 1)
    return min(_BACKOFF_CAP, grown) * random.uniform(0.8, 1.2)


async def _read_applied(conn: Connection, sql: Statements) -> list[Applied] | None:
    applied: list[Applied] | None = await run_plan_async(
        recorded_plan(sql), functools.partial(fetch_on, conn)
    )
    return applied


def recorded_plan(sql: Statements) -> Plan:
    """Every migration the schema records (the history and 0.1's record merged), or None when
    it has neither record: never migrated. A plan any client runs (a producer checks the
    schema it writes to the same way)."""
    [(record, history)] = yield Query(
        sql["records_exist"], (sql.table("migrations"), sql.table("schema_history"))
    )
    if not record and not history:
        return None
    applied = {}
    if history:
        for version, name, level, applied_at, applied_by in (yield Query(sql["read_history"], ())):
            applied[version] = Applied(version, level, name, applied_by, applied_at)
    if record:
        known = {m.version: m for m in sql.migrations}
        for version, applied_at in (yield Query(sql["read_record"], ())):
            if version in applied or version >= MARK_FOR_0_1:
                continue  # in the history already, or the mark that keeps 0.1 out
            migration = known.get(version)
            applied[version] = Applied(
                version,
                (migration.level or 1) if migration else None,
                migration.name if migration else "",
                "",
                applied_at,
            )
    return list(applied.values())


async def _keep_0_1s_record(conn: Connection, sql: Statements, level: int) -> None:
    """0.1's record as 0.1 must find it: its own migrations only while it can use the schema,
    a mark past them (which it refuses) once it cannot."""
    mark = mark_for_0_1(level, NEWEST_IN_0_1)
    await conn.execute(sql["forget_for_0_1"], NEWEST_IN_0_1, mark)
    if mark > NEWEST_IN_0_1:
        await conn.execute(sql["record_migration"], mark, time.time())


async def check_migrated(bridge: Bridge, sql: Statements) -> None:
    """Refuse to open on a schema that is missing, behind this release, or at a compatibility
    level it does not work with; a newer release's additive migrations are fine."""

    async def read(conn: Connection) -> list[Applied] | None:
        return await _read_applied(conn, sql)

    judge_schema(sql, await bridge.run(read, what=f"checking schema {sql.schema!r}"))


def judge_schema(sql: Statements, applied: Sequence[Applied] | None) -> None:
    """Refuse a schema (``recorded_plan``'s answer) that was never migrated, lacks this
    release's migrations, or is at a level it does not work with; say once that a newer
    release's additive migrations are there."""
    if applied is None:
        raise ConfigError(
            f"schema {sql.schema!r} has no jobs_trio tables: the database was never migrated",
            fix=f"run `jobs-trio migrate --db URL` (schema {sql.schema!r}) once per deploy, or "
            "open the driver with migrate=True",
        )
    where = f"schema {sql.schema!r}"
    verdict = judge(sql.migrations, applied)
    refuse_incompatible(verdict, where)
    if verdict.missing:
        missing = [m.version for m in verdict.missing]
        raise ConfigError(
            f"schema {sql.schema!r} lacks migrations {missing} that jobs_trio {VERSION} needs",
            fix="run `jobs-trio migrate --db URL` before starting workers of this version, or "
            "open the driver with migrate=True",
        )
    note_ahead(verdict, where)
