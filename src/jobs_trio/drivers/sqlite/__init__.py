# The SQLite driver: the whole contract on one WAL database file that worker processes on one
# machine share, as SQL; each capability a room of this package over one connection layer
# (_connection.py). Apart from the door (_sqlite_door.py) and the file itself (_sqlite_migrate.py).
from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

from ..._core.errors import ConfigError
from .._sqlite_migrate import open_sqlite_file
from ..contract import Capabilities
from ._admin import SqliteAdmin
from ._connection import POLL_INTERVAL
from ._cron import SqliteCron
from ._fleet import SqliteFleet
from ._jobs import SqliteJobs
from ._outbox_relay import SqliteOutboxAndRelay
from ._steps_events import SqliteStepsAndEvents


@contextlib.asynccontextmanager
async def open_sqlite_driver(
    url: str,
    *,
    clock: Callable[[], float] = time.time,
    busy_timeout: float = 5.0,
    poll_interval: float = POLL_INTERVAL,
    synchronous: str = "FULL",
    read_only: bool = False,
    create: bool = True,
    migrate: bool = False,
) -> AsyncIterator[SqliteDriver]:
    """Open ``sqlite:///jobs.db``: create or upgrade the schema, switch to WAL, and close the
    connection on the way out. A new file is created readable by its owner only (0600).
    ``migrate`` changes nothing (every open to write migrates) and is taken so that one set of
    options serves every URL; with ``read_only=True`` it is refused (that open never migrates).

    ``read_only=True`` creates, upgrades and changes nothing: a missing file is "no database
    at PATH", a file at an older schema version is refused, and every write is refused by
    SQLite itself (`ConfigError`, never a retry). ``create=False`` opens to write, but only a
    file that is already there (an operator's retry or cancel of a job that must exist).

    ``busy_timeout`` is how long a call waits for another connection's write lock before a few
    last tries and then `DriverError`. ``synchronous`` is FULL (a committed job survives a power
    cut) unless you choose NORMAL (faster; survives a crash of the process, not of the OS).
    """
    if migrate and read_only:
        raise ConfigError(
            "migrate=True and read_only=True were both given: a read-only open never migrates",
            fix="drop read_only to migrate the file (every open to write does), or drop migrate",
        )
    async with open_sqlite_file(
        url,
        clock=clock,
        busy_timeout=busy_timeout,
        synchronous=synchronous,
        read_only=read_only,
        create=create,
    ) as (door, _):
        driver = SqliteDriver(door, url=url, poll_interval=poll_interval)
        try:
            yield driver
        finally:
            await driver.aclose()


class SqliteDriver(
    SqliteJobs, SqliteStepsAndEvents, SqliteCron, SqliteOutboxAndRelay, SqliteFleet, SqliteAdmin
):
    """Jobs in one SQLite file, reached through one connection that one worker thread at a time
    uses. Open it with `open_sqlite_driver`, which prepares the schema and closes it after."""

    # Every capability of the contract (Capabilities) but claims side by side: its one
    # connection runs one statement at a time (the door's thread), so a second claim would wait.
    capabilities = Capabilities.every(claims_side_by_side=False)
