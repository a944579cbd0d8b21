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
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final

import attrs
import trio

from .._core.boundary import check_seconds
from .._core.errors import ConfigError, SchemaVersionError
from .._core.version import VERSION
from ._gil_handoff import DoorConnection
from ._migration_files import COMPATIBILITY_LEVEL, Migration, read_migrations
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
from ._sqlite_door import BUSY_SLICE, SqliteDoor, remember_file

# Written into the file header (PRAGMA application_id): how a file says it is a jobs_trio
# database, so a file of another application is refused instead of having tables added to it.
APPLICATION_ID: Final = 0x4A54524F  # "JTRO"

# RETURNING (3.35) is used by claim, renew and save_step.
MIN_SQLITE: Final = (3, 35, 0)

_SYNCHRONOUS: Final = ("OFF", "NORMAL", "FULL", "EXTRA")


# The migrations: numbered .sql files in sqlite_migrations/, each recorded in the file's
# schema_history table once applied. PRAGMA user_version is 0.1's record (its strict check
# reads it): 9, its newest, while 0.1 can use the file; past every migration once it cannot
# (_schema_compatibility.MARK_FOR_0_1). A file 0.1 wrote has no history: user_version says
# which migrations it holds.
NEWEST_IN_0_1: Final = 9

_CREATE_HISTORY: Final = """
CREATE TABLE IF NOT EXISTS schema_history (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    level      INTEGER NOT NULL,  -- the compatibility level once it was applied
    applied_at REAL NOT NULL,
    applied_by TEXT NOT NULL      -- the release that applied it ('' for 0.1)
)"""
_RECORD: Final = (
    "INSERT OR IGNORE INTO schema_history (version, name, level, applied_at, applied_by)"
    " VALUES (?, ?, ?, ?, ?)"
)


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


KNOWN: Final = read_migrations("sqlite_migrations")
for _migration in KNOWN:
    _statements(_migration.sql)  # an unfinished statement fails the import, not an upgrade
    if not _migration.transaction:
        # A file's migrations are one write transaction here: the line would be a promise
        # nothing keeps (a build SQLite blocks writers for whatever it says).
        raise RuntimeError(f"{_migration.name}: SQLite has no `-- transaction: none`")
# The newest migration this release ships.
SCHEMA_VERSION: Final = KNOWN[-1].version


# The URL and the file, before any connection is made.


# The longest busy_timeout taken: SQLite's own is an int of milliseconds (PRAGMA busy_timeout),
# and a wait of more than a day is a lock nobody will let go.
MAX_BUSY_TIMEOUT: Final = 86_400.0


def check_busy_timeout(value: object) -> float:
    """``busy_timeout=`` as a driver or a producer takes it: seconds from 0 to a day. Checked
    where it is given: a NaN, an infinity or a str failed at the first write, with a bare
    ValueError or OverflowError and no code."""
    return check_seconds(value, argument="busy_timeout", high=MAX_BUSY_TIMEOUT)


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


def _reads_as_sqlite(path: str, *, write: bool = False) -> bool | None:
    """Whether SQLite reads the file at ``path`` as a database (an empty file is one it may
    start), None when there is no file. Asked of SQLite through a connection of its own, never
    by opening the file ourselves: a write connection would notice a foreign file only at its
    first statement, and closing a descriptor of our own on the file drops every POSIX lock
    this process holds on it, its other connections' included (SQLite keeps its descriptors
    open while a lock is held). Without its lock a worker's connection was not counted: the
    next process to close the file took itself for the last, checkpointed and deleted the WAL
    the worker went on writing to, and its commits were lost and the file corrupted.

    ``write``: the look of an open to write, which may roll back a journal a killed process
    left (a read-only look cannot, and refused the file). It never waits for a lock, and says
    only "not a database": anything else it meets (a lock, a journal, a permission) is left
    to the connection that follows, which says it as it would have."""
    if not os.path.exists(path):
        return None
    if os.path.isdir(path):
        raise ConfigError(
            f"{path!r} is a directory, not a SQLite database file",
            fix="point the URL at a file inside it (sqlite:///folder/jobs.db)",
        )
    uri = pathlib.Path(path).absolute().as_uri() + ("?mode=rw" if write else "?mode=ro")
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=0)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.Error as exc:
        return getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_NOTADB
    return True


_NOT_READ_AS_SQLITE: Final = "SQLite does not read it as a database (its header is not SQLite's)"


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
    # For a jobs_trio file, the newest migration applied to it (a newer release's included);
    # for another, its PRAGMA user_version.
    schema_version: int = 0
    tables: tuple[str, ...] = ()
    problem: str = ""  # NOT_SQLITE: why
    # For a jobs_trio file, its compatibility level (_schema_compatibility).
    level: int = 0


def identify(path: str) -> SqliteFile:
    """Is the file at ``path`` a jobs_trio database, and at which schema version? Read through
    a read-only connection: nothing is created, migrated or written (a WAL file's reader may
    add the -wal and -shm files beside it, as any reader does). A file this user cannot read is
    a `ConfigError`."""
    reads = _reads_as_sqlite(path)
    if reads is None:
        return SqliteFile(path, FileKind.MISSING)
    if not reads:
        return SqliteFile(path, FileKind.NOT_SQLITE, problem=_NOT_READ_AS_SQLITE)
    try:
        uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            app_id, version, tables = _marks(conn)
            kind = _kind(app_id, version, tables)
            level = 0
            if kind is FileKind.JOBS_TRIO:
                applied = _read_applied(conn, version, tables)
                version = max((m.version for m in applied), default=0)
                level = judge(KNOWN, applied).level
    except sqlite3.Error as exc:
        return SqliteFile(path, FileKind.NOT_SQLITE, problem=str(exc))
    return SqliteFile(path, kind, app_id, version, tables, level=level)


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
    if _reads_as_sqlite(path, write=not read_only) is False:
        raise ConfigError(
            f"{path!r} is not a SQLite database ({_NOT_READ_AS_SQLITE}); it was left untouched",
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
            # Its statements open the door's GIL handoff (_gil_handoff.py).
            factory=DoorConnection,
        )
    except sqlite3.Error as exc:
        raise ConfigError(
            f"cannot open the SQLite database {path!r}: {exc}",
            fix="check that the folder exists and is writable by this user",
        ) from exc
    remember_file(conn, path)
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


async def migrate(url: str) -> list[int]:
    """Create or upgrade the file ``url`` names (what opening it to write does, and all), and
    answer the versions this call applied."""
    async with open_sqlite_file(url) as (_, done):
        return done


@contextlib.asynccontextmanager
async def open_sqlite_file(
    url: str,
    *,
    clock: Callable[[], float] = time.time,
    busy_timeout: float = 5.0,
    synchronous: str = "FULL",
    read_only: bool = False,
    create: bool = True,
) -> AsyncIterator[tuple[SqliteDoor, list[int]]]:
    """The door to the file ``url`` names, the file checked (and unless ``read_only``, created
    or upgraded and switched to WAL) before it is handed out, and the versions its open
    applied; closed on the way out. `open_sqlite_driver` documents the options."""
    path = sqlite_path(url)
    busy_timeout = check_busy_timeout(busy_timeout)
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
        done = await _prepare(door, read_only, synchronous.upper())
        yield door, done
    finally:
        await door.aclose()


# Checking and migrating, inside the door's transactions.


async def _prepare(door: SqliteDoor, read_only: bool, synchronous: str) -> list[int]:
    """Check (and unless ``read_only``, migrate) the file; the versions applied."""
    path = door.path
    if read_only:
        # Checked, never changed: a read-only open leaves the file exactly as it was.
        verdict = await door.transact(lambda conn, now: _check_current(conn, path), mode="read")
        note_ahead(verdict, repr(path))
        return []
    done, verdict = await door.transact(lambda conn, now: _migrate(conn, path), mode="write")
    note_ahead(verdict, repr(path))
    await door.transact(lambda conn, now: _use_wal(conn, path), mode="bare")
    # Even this reads the file: it comes after the check that the file is ours.
    await door.transact(
        lambda conn, now: conn.execute(f"PRAGMA synchronous = {synchronous}"), mode="bare"
    )
    await door.transact(lambda conn, now: _tune_writes(conn), mode="bare")
    return done


# Pages a writer lets the WAL hold before its commit copies them back into the file (SQLite's
# default is 1,000). A worker's commits rewrite the same hot pages (the claim index's front,
# the history ring): a checkpoint copies each page once however often the WAL holds it, so
# fewer checkpoints copy far fewer pages. The WAL file grows to ~32 MiB at 4 KiB pages.
WAL_AUTOCHECKPOINT: Final = 8000
# The write connection's page cache, KiB (_tune_writes).
CACHE_KIB: Final = 16 * 1024


def _tune_writes(conn: sqlite3.Connection) -> None:
    """The write path's connection settings: neither changes what a commit makes durable.
    temp_store=MEMORY keeps statement journals (a multi-row UPDATE's undo, kept in case it
    fails halfway inside the transaction) in memory: SQLite spilled them to a temporary file
    past 64 KiB, two writes a page, the largest share of the door thread's system time (issue
    44: strace counted 42,000 such writes in 10,000 jobs). It also keeps an application's
    TEMP tables on the driver's connection in memory. A page cache of 16 MiB (SQLite's default
    is 2): a large enqueue_many inserts ids at random places in the primary key's index, and
    with the default cache each insert past a few hundred thousand rows read its index pages
    back from the OS (500,000 jobs: 15.3 s of CPU, 12.8 with this; 64 MiB 12.4). Filled only as
    pages are read; a worker's steady state was level with a larger one (issue 44)."""
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT}")


def _read_applied(conn: sqlite3.Connection, version: int, tables: tuple[str, ...]) -> list[Applied]:
    """The migrations the file records: its history, or for a file 0.1 wrote (no history yet),
    those its user_version (``version``) says it holds."""
    if "schema_history" in tables:
        return [
            Applied(row[0], row[2], row[1], row[4], row[3])
            for row in conn.execute(
                "SELECT version, name, level, applied_at, applied_by FROM schema_history"
            )
        ]
    applied = [Applied(m.version, m.level or 1, m.name) for m in KNOWN if m.version <= version]
    if SCHEMA_VERSION < version < MARK_FOR_0_1:
        # A release before the history, newer than this one: nothing tells whether this one
        # can work with it (refuse_incompatible says so).
        applied.append(Applied(version, None))
    return applied


def _check_schema(
    conn: sqlite3.Connection,
    path: str,
    *,
    known: Sequence[Migration] = KNOWN,
    works_with: int = COMPATIBILITY_LEVEL,
) -> tuple[int, list[Applied], Verdict]:
    """The file's application_id, applied migrations and verdict, once it is known to be ours
    or new and a schema this release can use."""
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
    applied = _read_applied(conn, version, tables) if app_id == APPLICATION_ID else []
    verdict = judge(known, applied, works_with=works_with)
    refuse_incompatible(verdict, repr(path), works_with=works_with)
    return app_id, applied, verdict


def check_readable(path: str) -> None:
    """Refuse a jobs_trio file this release cannot read or write as it is (behind this
    release, or at a compatibility level it does not work with), reading it through a
    read-only connection: for a writer that never migrates (a producer)."""
    uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        verdict = _check_current(conn, path)
    note_ahead(verdict, repr(path))


def _check_current(conn: sqlite3.Connection, path: str) -> Verdict:
    _, applied, verdict = _check_schema(conn, path)
    if not applied:
        raise ConfigError(
            f"{path!r} is an empty SQLite file, not a jobs_trio database yet",
            fix="check the path; `jobs-trio migrate --db URL` makes it one",
        )
    if verdict.missing:
        raise SchemaVersionError(
            f"{path!r} lacks jobs_trio migrations {[m.version for m in verdict.missing]} that"
            f" jobs_trio {VERSION} reads; a read-only open does not upgrade it",
            fix="run `jobs-trio migrate --db URL` once to upgrade it",
        )
    return verdict


def _migrate(
    conn: sqlite3.Connection,
    path: str,
    *,
    known: Sequence[Migration] = KNOWN,
    works_with: int = COMPATIBILITY_LEVEL,
    release: str = VERSION,
) -> tuple[list[int], Verdict]:
    """Apply what the file lacks, in the door's write transaction: all of it or nothing.
    ``known``, ``works_with`` and ``release`` are this release's (another's, in a test that
    plays the next release)."""
    app_id, applied, verdict = _check_schema(conn, path, known=known, works_with=works_with)
    conn.execute(_CREATE_HISTORY)
    for one in applied:  # a file 0.1 wrote: its migrations, into the history
        conn.execute(
            _RECORD, (one.version, one.name, one.level, one.applied_at or 0.0, one.applied_by)
        )
    level = verdict.level
    done: list[int] = []
    for migration in verdict.missing:
        level = _apply(conn, migration, level, release)
        done.append(migration.version)
    if app_id != APPLICATION_ID:
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    mark = mark_for_0_1(level, NEWEST_IN_0_1)
    if conn.execute("PRAGMA user_version").fetchone()[0] != mark:
        conn.execute(f"PRAGMA user_version = {mark}")
    return done, verdict


def _apply(conn: sqlite3.Connection, migration: Migration, level: int, release: str) -> int:
    for statement in _statements(migration.sql):
        conn.execute(statement)
    level = level_after(level, migration)
    conn.execute(_RECORD, (migration.version, migration.name, level, time.time(), release))
    return level


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
