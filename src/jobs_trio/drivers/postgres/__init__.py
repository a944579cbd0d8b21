# The PostgreSQL driver: the Driver contract in SQL (SKIP LOCKED claims, fenced settles in
# batches, LISTEN/NOTIFY wake-ups), for fleets of workers on any number of machines. Apart from
# the bridge, listener and migrations; each capability a room of this package over one connection
# layer (_connection.py), the statements it sends beside it.
from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from ..._core.single_error import unwrap_single_error
from .._postgres_bridge import Bridge
from .._postgres_listener import Listener
from .._postgres_migrate import apply_migrations, check_migrated, holders_namer, migrate
from .._postgres_open import open_bridge
from .._postgres_pool import session_settings
from .._postgres_pooler import Pooler
from .._postgres_sql import Statements, load_statements
from ..contract import Capabilities
from ._admin import PostgresAdmin

# What bench/claim_floor.py and bench/claim_churn.py send as the driver sends it.
from ._claim_statements import _claim_arguments as _claim_arguments
from ._cron import PostgresCron
from ._fleet import PostgresFleet
from ._jobs import PostgresJobs
from ._outbox_relay import PostgresOutboxAndRelay
from ._settle_statements import _settle_columns as _settle_columns
from ._steps_events import PostgresStepsAndEvents

__all__ = ["PostgresDriver", "migrate", "open_postgres_driver"]


@contextlib.asynccontextmanager
async def open_postgres_driver(
    url: str,
    *,
    clock: Callable[[], float] = time.time,
    schema: str = "jobs_trio",
    migrate: bool = False,
    pool_size: int = 10,
    loop: Any = None,
    drop_schema_on_close: bool = False,
    statement_timeout: float | None = None,
    lock_timeout: float | None = None,
    pgbouncer: str | None = None,
    listen_url: str | None = None,
) -> AsyncIterator[PostgresDriver]:
    """A driver on ``schema`` for as long as the block runs.

    ``migrate=True`` applies pending migrations first (else an unmigrated schema is refused
    with the fix). ``loop`` is a trio-asyncio loop to run on; by default the one the caller
    already runs in, else one the driver opens for its own lifetime. ``pool_size`` bounds the
    connections operations use at once; the LISTEN connection is one more. An application's
    own connection passed as ``connection=`` must live on the same loop (``driver.loop``).
    ``statement_timeout`` and ``lock_timeout`` (seconds; else the URL's
    ``?statement_timeout=30s&lock_timeout=2s``, else those defaults; 0 turns one off) bound every
    statement the driver's own connections run. ``pgbouncer`` ("session" or "transaction"; else
    the URL's ``?pgbouncer=``) says PgBouncer stands in between, and ``listen_url`` (else the URL's
    ``?listen_host=&listen_port=``) where LISTEN connects directly (_postgres_pooler.py,
    docs/drivers.md). ``drop_schema_on_close`` is for tests."""
    statements = load_statements(schema)
    session = session_settings(url, statement_timeout=statement_timeout, lock_timeout=lock_timeout)
    pooler = Pooler.of(url, pgbouncer, listen_url)
    with unwrap_single_error():
        async with (
            open_bridge(
                url,
                loop=loop,
                pool_size=pool_size,
                application_name=f"jobs_trio:{schema}",
                session=session,
                pooler=pooler,
                name_holders=holders_namer(statements),
            ) as bridge,
            _open_on(bridge, statements, clock, migrate, drop_schema_on_close) as driver,
        ):
            yield driver


@contextlib.asynccontextmanager
async def _open_on(
    bridge: Bridge,
    statements: Statements,
    clock: Callable[[], float],
    migrate: bool,
    drop_schema_on_close: bool,
) -> AsyncIterator[PostgresDriver]:
    """The driver proper, on an open bridge: schema checked (or migrated), the LISTEN
    connection made (it LISTENs once something waits for work: Listener.listen)."""
    if migrate:
        await apply_migrations(bridge, statements)
    else:
        await check_migrated(bridge, statements)
    listener = Listener(bridge, statements.channel)
    driver = PostgresDriver(bridge.url, bridge, statements, listener, clock)
    try:
        async with trio.open_nursery() as nursery:
            if bridge.pooler.listen_url is not None:
                await nursery.start(listener.run)
            else:
                # PgBouncer in transaction mode and no direct connection: no LISTEN can hold,
                # so wait_for_work polls (DEAF_POLL) while `listening` stays False.
                listener.deaf()
            try:
                yield driver
            finally:
                driver._closed = True
                nursery.cancel_scope.cancel()
    finally:
        if drop_schema_on_close:
            await driver._drop_schema()


class PostgresDriver(
    PostgresJobs,
    PostgresStepsAndEvents,
    PostgresCron,
    PostgresOutboxAndRelay,
    PostgresFleet,
    PostgresAdmin,
):
    """Jobs in PostgreSQL. Open it with :func:`open_postgres_driver`; every method crosses into
    asyncpg once (a batch of claims is one statement, a batch of settlements one transaction)."""

    # Every capability of the contract (Capabilities): the conformance suite tests each.
    capabilities = Capabilities.every()
