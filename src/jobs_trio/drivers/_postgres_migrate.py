# Schema migrations for the PostgreSQL driver: numbered SQL files applied one transaction each,
# under an advisory lock and a short lock timeout retried with backoff (the fleet's statements
# never queue long behind one), and the check a driver makes on open. Apart because `jobs-trio
# migrate` runs it without a driver, and because it is the only code that changes the schema.
from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import trio

from .._core.errors import ConfigError, RowLocked
from .._core.logs import log_event
from .._core.version import VERSION
from ._migration_files import COMPATIBILITY_LEVEL, Migration
from ._postgres_bridge import Bridge, NameHolders, open_bridge, sole_error
from ._postgres_locks import LockHolder, described, lock_holders
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

# 0.1's newest migration: its record (`migrations`) holds 0001-0010 and nothing past them while
# the schema stays one 0.1 can use (_schema_compatibility.MARK_FOR_0_1).
NEWEST_IN_0_1: Final = 10


def holders_namer(sql: Statements) -> NameHolders:
    """How the bridge names the sessions holding a lock on this schema's tables."""
    statement, schema = sql["lock_holders"], sql.schema

    async def name(conn: Connection, waited: float) -> list[LockHolder]:
        return await lock_holders(conn, statement, schema, waited)

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
    with sole_error():
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
    own (its locks held only as long as it runs), and answer their versions. ``works_with``
    and ``release`` are this release's (another's, in a test that plays the next release)."""
    where = f"schema {sql.schema!r}"
    deadline = trio.current_time() + wait

    async def retried(op: Callable[[Connection], Awaitable[T]], what: str) -> T:
        return await _retried(bridge, op, what, where, lock_timeout, deadline)

    async def begin(conn: Connection) -> tuple[Verdict, list[Applied]]:
        """The waits, the advisory lock, and what the schema holds now (read under the lock:
        another migrator may have applied what this one was about to)."""
        await conn.execute(sql["migration_waits"])
        # The advisory lock waits without bound: a second migrator waits for the first's
        # transaction, which holds no table's lock for longer than its own statements take.
        await conn.execute(sql["migration_lock"], sql.migration_lock_key)
        await conn.execute(sql["migration_lock_timeout"], f"{round(lock_timeout * 1000)}ms")
        applied = await _read_applied(conn, sql) or []
        verdict = judge(sql.migrations, applied, works_with=works_with)
        refuse_incompatible(verdict, where, works_with=works_with)
        return verdict, applied

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

    async def apply(conn: Connection, migration: Migration) -> int | None:
        """The schema's level once ``migration`` is applied; None if another migrator applied
        it meanwhile."""
        verdict, _ = await begin(conn)
        if migration not in verdict.missing:
            return None
        await conn.execute(migration.sql)
        level = level_after(verdict.level, migration)
        now = time.time()
        await conn.execute(
            sql["record_history"], migration.version, migration.name, level, now, release
        )
        if migration.version <= NEWEST_IN_0_1:
            await conn.execute(sql["record_migration"], migration.version, now)
        await _keep_0_1s_record(conn, sql, level)
        return level

    verdict = await retried(prepare, "preparing")
    applied = []
    for migration in verdict.missing:

        async def apply_this(conn: Connection, migration: Migration = migration) -> int | None:
            return await apply(conn, migration)

        started = trio.current_time()
        level = await retried(apply_this, f"migration {migration.name}")
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


async def _retried(
    bridge: Bridge,
    op: Callable[[Connection], Awaitable[T]],
    what: str,
    where: str,
    lock_timeout: float,
    deadline: float,
) -> T:
    """``op`` in a transaction, tried again after a pause each time a lock it needs was held
    past ``lock_timeout``, each try's holders named in the log, until ``deadline``."""
    started = trio.current_time()
    tries = 0
    while True:
        tries += 1
        try:
            return await bridge.run(
                op,
                what=f"{what} of {where}",
                transaction=True,
                bounded=False,
                lock_wait=lock_timeout,
            )
        except RowLocked as locked:
            holders: Sequence[Any] = locked.holders
            now = trio.current_time()
            said = described([h for h in holders if isinstance(h, LockHolder)])
            if now >= deadline:
                raise RowLocked(
                    f"{what} of {where} waited {now - started:.1f} s for its locks"
                    f" ({tries} tries of {lock_timeout:g} s each) and gave up: {said}",
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
                why=f"a lock it needs was held past its {lock_timeout:g} s lock timeout; it"
                " let the fleet's statements through and tries again",
            )
            await trio.sleep(pause)


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
