# The SQLite file: what a URL names, whether a file is a jobs_trio database and at which schema
# version, and making it one (migrations, WAL). Apart because the CLI and the demo ask about a
# file without opening a driver, and because it is the only code that changes the schema.
from __future__ import annotations

import contextlib
import enum
import os
import pathlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

import attrs
import trio

from .._core.errors import ConfigError, SchemaVersionError
from ._migration_files import read_migrations
from ._sqlite_door import BUSY_SLICE, SqliteDoor

# Written into the file header (PRAGMA application_id): how a file says it is a jobs_trio
# database, so a file of another application is refused instead of having tables added to it.
APPLICATION_ID: Final = 0x4A54524F  # "JTRO"

# RETURNING (3.35) is used by claim, renew and save_step.
MIN_SQLITE: Final = (3, 35, 0)

_SQLITE_HEADER: Final = b"SQLite format 3\x00"
_SYNCHRONOUS: Final = ("OFF", "NORMAL", "FULL", "EXTRA")


# The migrations: numbered .sql files in sqlite_migrations/; the schema version is the last one.


def _statements(script: str) -> list[str]:
    """Split a script into statements: `executescript` would COMMIT the migration's transaction
    before running it, and a half-applied migration must roll back whole."""
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if any(ln.strip() and not ln.strip().startswith("--") for ln in pending.splitlines()):
        raise RuntimeError(f"an SQLite migration ends in an unfinished statement: {pending!r}")
    return statements


MIGRATIONS: Final = [(m.version, _statements(m.sql)) for m in read_migrations("sqlite_migrations")]
SCHEMA_VERSION: Final = MIGRATIONS[-1][0]


# The URL and the file, before any connection is made.


def sqlite_path(url: str) -> str:
    """The file a ``sqlite:///relative.db`` or ``sqlite:////absolute.db`` URL names."""
    fix = "write sqlite:///relative/path.db or sqlite:////absolute/path.db (three slashes, a path)"
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ConfigError(f"SQLite URL {url!r} does not start with {prefix!r}", fix=fix)
    path = url[len(prefix) :]
    if not path or path.endswith("/"):
        raise ConfigError(f"SQLite URL {url!r} names no database file", fix=fix)
    if path == ":memory:" or path.startswith("file:"):
        raise ConfigError(
            f"SQLite URL {url!r} is not a file path",
            fix="use memory:// for a store that need not outlive the process, or " + fix,
        )
    if "?" in path:
        raise ConfigError(
            f"SQLite URL {url!r} carries query options, which the driver does not read",
            fix="drop the ?... part and pass options (busy_timeout=...) to open_driver",
        )
    return path


def _header(path: str) -> bytes | None:
    """The file's first bytes, or None when there is no file. Read ourselves: SQLite would only
    notice a foreign file at the first statement, after the open had become a write to it."""
    try:
        with open(path, "rb") as file:
            return file.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(
            f"cannot read the SQLite database file {path!r}: {exc}",
            fix="check the path and its permissions",
        ) from exc


def _is_sqlite(head: bytes) -> bool:
    return not head or head == _SQLITE_HEADER  # an empty file is a database SQLite may start


# What a file is: the public check.


class FileKind(enum.StrEnum):
    MISSING = "missing"  # no file at the path
    NEW = "new"  # empty, or a SQLite database holding nothing: an open to write makes it ours
    JOBS_TRIO = "jobs_trio"  # carries jobs_trio's application_id
    FOREIGN = "foreign"  # a SQLite database of another application
    NOT_SQLITE = "not sqlite"  # not a SQLite database at all, or one SQLite cannot read


@attrs.frozen
class SqliteFile:
    """What the file at ``path`` is, as read without changing it."""

    path: str
    kind: FileKind
    application_id: int = 0
    # PRAGMA user_version: for a jobs_trio file, the last migration applied to it.
    schema_version: int = 0
    tables: tuple[str, ...] = ()
    problem: str = ""  # NOT_SQLITE: why


def identify(path: str) -> SqliteFile:
    """Is the file at ``path`` a jobs_trio database, and at which schema version? Read through
    a read-only connection: nothing is created, migrated or written (a WAL file's reader may
    add the -wal and -shm files beside it, as any reader does). A file this user cannot read is
    a `ConfigError`."""
    head = _header(path)
    if head is None:
        return SqliteFile(path, FileKind.MISSING)
    if not _is_sqlite(head):
        return SqliteFile(
            path, FileKind.NOT_SQLITE, problem="it does not start with the SQLite header"
        )
    try:
        uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            app_id, version, tables = _marks(conn)
    except sqlite3.Error as exc:
        return SqliteFile(path, FileKind.NOT_SQLITE, problem=str(exc))
    return SqliteFile(path, _kind(app_id, version, tables), app_id, version, tables)


def _marks(conn: sqlite3.Connection) -> tuple[int, int, tuple[str, ...]]:
    """(application_id, user_version, the tables): what tells whose a file is."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = tuple(
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    )
    return app_id, version, tables


def _kind(app_id: int, version: int, tables: tuple[str, ...]) -> FileKind:
    if app_id == APPLICATION_ID:
        return FileKind.JOBS_TRIO
    if tables or version or app_id:
        return FileKind.FOREIGN
    return FileKind.NEW


# Opening the file.


def _connect(path: str, busy_timeout: float, read_only: bool, create: bool) -> sqlite3.Connection:
    if read_only or not create:
        _refuse_a_missing_file(path)
    head = _header(path)
    if head is not None and not _is_sqlite(head):
        raise ConfigError(
            f"{path!r} is not a SQLite database (it does not start with the SQLite header); "
            "it was left untouched",
            fix="point the URL at a new file or at an existing jobs_trio database",
        )
    if not read_only:
        _create_for_owner_only(path)
    try:
        conn = sqlite3.connect(
            # mode=ro: SQLite itself refuses every write, and never creates the file.
            pathlib.Path(path).absolute().as_uri() + "?mode=ro" if read_only else path,
            timeout=min(busy_timeout, BUSY_SLICE),
            # isolation_level=None: the module issues no BEGIN of its own; every transaction
            # here is an explicit BEGIN / BEGIN IMMEDIATE in the door (_sqlite_door.py).
            isolation_level=None,
            # One connection, used by one worker thread at a time (under the door's lock),
            # but not always the same thread.
            check_same_thread=False,
            cached_statements=256,
            uri=read_only,
        )
    except sqlite3.Error as exc:
        raise ConfigError(
            f"cannot open the SQLite database {path!r}: {exc}",
            fix="check that the folder exists and is writable by this user",
        ) from exc
    return conn


def open_beside(path: str, busy_timeout: float) -> sqlite3.Connection:
    """A second connection to a file the driver has opened and checked, for a thread that may
    block (the lease lifeline's): SQLite's own busy handler waits out another writer."""
    conn = _connect(path, busy_timeout, read_only=False, create=False)
    conn.execute(f"PRAGMA busy_timeout = {max(1, round(busy_timeout * 1000))}")
    return conn


def _refuse_a_missing_file(path: str) -> None:
    """An open that must find a database (read-only, or create=False) at a path that is not
    there was given a mistyped path: creating (and migrating) an empty database there would
    answer "no jobs", or "no job with id ...", about the wrong file."""
    if not os.path.exists(path):
        raise ConfigError(
            f"no database at {path!r}",
            fix=f"check the path (a relative one starts from {os.getcwd()!r}); a new database"
            " is created only by opening it to write (`jobs-trio migrate`, `enqueue`, a worker)",
        )


def _create_for_owner_only(path: str) -> None:
    """Create a new database file readable and writable by its owner alone (0600): the jobs'
    payloads, results and errors are the application's data. SQLite itself would create it
    0644, and gives the -wal and -shm files it adds later the database file's own mode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # an existing file keeps the mode its owner gave it
    except OSError:
        return  # the folder is missing or not writable: sqlite3.connect says so just after
    os.close(fd)


@contextlib.asynccontextmanager
async def open_sqlite_file(
    url: str,
    *,
    clock: Callable[[], float] = time.time,
    busy_timeout: float = 5.0,
    synchronous: str = "FULL",
    read_only: bool = False,
    create: bool = True,
) -> AsyncIterator[SqliteDoor]:
    """The door to the file ``url`` names, the file checked (and unless ``read_only``, created
    or upgraded and switched to WAL) before it is handed out; closed on the way out.
    `open_sqlite_driver` documents the options."""
    path = sqlite_path(url)
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        raise ConfigError(
            f"the SQLite library is {sqlite3.sqlite_version}; the driver needs"
            f" {'.'.join(map(str, MIN_SQLITE))} or newer",
            fix="use a Python built against a newer SQLite",
        )
    if synchronous.upper() not in _SYNCHRONOUS:
        raise ConfigError(
            f"synchronous={synchronous!r} is not a SQLite synchronous level",
            fix="use one of " + ", ".join(_SYNCHRONOUS),
        )
    conn = await trio.to_thread.run_sync(_connect, path, busy_timeout, read_only, create)
    door = SqliteDoor(conn, path=path, clock=clock, busy_timeout=busy_timeout)
    try:
        await _prepare(door, read_only, synchronous.upper())
        yield door
    finally:
        await door.aclose()


async def migrate(url: str) -> None:
    """Create or upgrade the file ``url`` names: what opening it to write does, and all."""
    async with open_sqlite_file(url):
        pass


# Checking and migrating, inside the door's transactions.


async def _prepare(door: SqliteDoor, read_only: bool, synchronous: str) -> None:
    path = door.path
    if read_only:
        # Checked, never changed: a read-only open leaves the file exactly as it was.
        await door.transact(lambda conn, now: _check_current(conn, path), mode="read")
        return
    await door.transact(lambda conn, now: _migrate(conn, path), mode="write")
    await door.transact(lambda conn, now: _use_wal(conn, path), mode="bare")
    # Even this reads the file: it comes after the check that the file is ours.
    await door.transact(
        lambda conn, now: conn.execute(f"PRAGMA synchronous = {synchronous}"), mode="bare"
    )


def _check_schema(conn: sqlite3.Connection, path: str) -> tuple[int, int]:
    """The file's (application_id, user_version), once it is known to be ours or new."""
    app_id, version, tables = _marks(conn)
    if _kind(app_id, version, tables) is FileKind.FOREIGN:
        # Raised inside the transaction, before any write: the file stays as it was.
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise ConfigError(
            f"{path!r} is a SQLite database of another application"
            f" (application_id {app_id}, user_version {version},"
            f" tables: {shown or 'none'}); it was left untouched",
            fix="point the URL at a new file: jobs_trio keeps its jobs in a file of its own",
        )
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{path!r} has jobs_trio schema version {version}, newer than the"
            f" {SCHEMA_VERSION} this jobs_trio knows: a newer release wrote it",
            fix="upgrade jobs_trio here to the release that wrote the file, or use another file",
        )
    return app_id, version


def _check_current(conn: sqlite3.Connection, path: str) -> None:
    _, version = _check_schema(conn, path)
    if version == 0:
        raise ConfigError(
            f"{path!r} is an empty SQLite file, not a jobs_trio database yet",
            fix="check the path; `jobs-trio migrate --db URL` makes it one",
        )
    if version < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{path!r} has jobs_trio schema version {version}, older than the"
            f" {SCHEMA_VERSION} this jobs_trio reads; a read-only open does not upgrade it",
            fix="run `jobs-trio migrate --db URL` once to upgrade it",
        )


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    app_id, version = _check_schema(conn, path)
    for number, statements in MIGRATIONS:
        if number > version:
            for statement in statements:
                conn.execute(statement)
    if app_id != APPLICATION_ID:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    if version != SCHEMA_VERSION:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _use_wal(conn: sqlite3.Connection, path: str) -> None:
    # After the schema check, never before: the switch writes the file header, and a
    # foreign file must be left as it was. Outside a transaction: SQLite requires it.
    journal = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(journal).lower() != "wal":
        raise ConfigError(
            f"{path!r} could not switch to WAL (journal mode stayed {journal!r})",
            fix="put the database on a local file system: WAL needs shared memory,"
            " which network file systems do not offer",
        )
