# The SQLite driver's one door from Trio to its connection: a worker thread per call, one call
# at a time, a cancel that interrupts and rolls back, a busy file waited out from Trio. Apart
# because this is the concurrency half of the driver; the contract's SQL never sees a thread.
from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Final, Generic, Literal, TypeVar

import outcome
import trio

from .._core.errors import ConfigError, DriverError, ValueRefused
from .._core.forked_child import end_if_forked, own_pid
from ._gil_handoff import DoorConnection, GilHandoff
from ._rules import driver_closed

T = TypeVar("T")

Mode = Literal["read", "write", "bare"]  # BEGIN, BEGIN IMMEDIATE, or no transaction at all
Work = Callable[[sqlite3.Connection, float], T]  # gets the connection and the driver's now

# SQLite's own busy handler cannot be interrupted (sqlite3_interrupt does not reach it), so it
# is given at most this long per try; the rest of busy_timeout is waited out from Trio, where a
# cancel is heard.
BUSY_SLICE: Final = 0.1
# After busy_timeout has passed, a few more tries with a growing pause before giving up: a
# writer that held the file a little too long should cost a delay, not a crashed worker.
_BUSY_RETRIES: Final = 4
_BUSY_BACKOFF: Final = 0.05

# A cancelled call re-interrupts its statement this often until the thread has let go: an
# interrupt that lands between two statements of a transaction is a no-op in SQLite.
_INTERRUPT_AGAIN: Final = 0.05


# What SQLite (or its Python binding, while binding the arguments) raises for the VALUES of a
# write: a lone surrogate, an int past 64 bits, a string or blob past SQLITE_LIMIT_LENGTH,
# a constraint (NOT NULL for a NaN, a trigger's RAISE).
REFUSED: Final = (
    UnicodeError,
    OverflowError,
    sqlite3.DataError,
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
)

# Errors no retry can cure: a read-only file or folder (or a connection opened read-only), no
# permission, a file that cannot be opened.
_CANNOT_WRITE: Final = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN)


class SqliteDoor:
    """One connection to the file at ``path``, and the only way to it: `transact` runs a unit
    of work in a worker thread inside one transaction, one call at a time in call order.

    The door owns the connection, the lock that makes its calls one at a time, and the thread
    limiter they run under; `aclose` closes the connection once the call in flight has let go.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        path: str,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 5.0,
    ) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._conn = conn
        self._clock = clock
        # One connection: one call on it at a time. Trio's lock is FIFO, so calls run in the
        # order they were made.
        self._lock = trio.Lock()
        # The door's own thread token, not Trio's default limiter: abandoned sync job bodies
        # keep their tokens until they return, and enough of them would otherwise leave no
        # thread for the settle and the close a drain depends on. One is all the lock allows.
        self.threads = trio.CapacityLimiter(1)
        self.closed = False
        # The process this connection belongs to: a child forked by a job body shares its
        # file descriptor, and must never write through it (forked_child.py).
        self._owner = own_pid()
        self._handoff = GilHandoff()
        if isinstance(conn, DoorConnection):
            conn.handoff = self._handoff

    @property
    def conn(self) -> sqlite3.Connection:
        return self._conn

    def now(self) -> float:
        return self._clock()

    def lending(self) -> contextlib.AbstractContextManager[None]:
        """For the length of a call in a thread on this connection (the door's own, a caller's
        statements): the loop lends the thread the GIL (_gil_handoff.py), where else it would
        wait at each statement until the loop had nothing left to run."""
        lending: contextlib.AbstractContextManager[None] = self._handoff.lending()
        return lending

    def check_open(self) -> None:
        if self.closed:
            raise driver_closed("SQLite")

    async def transact(self, work: Work[T], *, mode: Mode = "write") -> T:
        """Run ``work(conn, now)`` in a worker thread inside one transaction (BEGIN IMMEDIATE
        for writes, so two processes never both claim a job), and commit it.

        A lock held by another connection is waited out for ``busy_timeout`` and then a few
        more tries; only then does a `DriverError` surface. A cancel interrupts the statement
        and rolls the transaction back: Cancelled then means nothing was written. If the COMMIT
        had already happened when the cancel arrived, the answer is returned instead, and the
        cancel lands at the caller's next checkpoint.
        """
        end_if_forked(self._owner)
        self.check_open()
        started = time.monotonic()
        retries = 0
        async with self._lock:
            while True:
                self.check_open()  # aclose() may have run while this call waited its turn
                try:
                    return await self._run_in_thread(work, mode)
                except REFUSED as exc:
                    # Rolled back already (_run_transaction): the file is as it was, and the
                    # same values would be refused again, so this is not worth a retry.
                    raise ValueRefused(
                        f"SQLite refused a write to {self.path!r}: {type(exc).__name__}: {exc}",
                        fix="the value cannot be stored as it is: check the text and numbers"
                        " this write carries (a lone surrogate, a value past a limit)",
                    ) from exc
                except sqlite3.Error as exc:
                    if not _is_busy(exc):
                        raise self.error(exc) from exc
                    if time.monotonic() - started < self.busy_timeout:
                        continue  # SQLite waited one slice; wait another, from here
                    if retries == _BUSY_RETRIES:
                        raise DriverError(
                            f"{self.path!r} stayed locked by another connection for"
                            f" {time.monotonic() - started:.1f} s (busy_timeout"
                            f" {self.busy_timeout} s, then {retries} more tries)",
                            fix="look for a process holding a long write transaction on this"
                            " file (a CLI, a backup, a DB browser), or raise busy_timeout",
                        ) from exc
                    retries += 1
                    pause = _BUSY_BACKOFF * 2**retries
                    await trio.sleep(pause * random.uniform(0.5, 1.0))

    async def _run_in_thread(self, work: Work[T], mode: Mode) -> T:
        with self.lending():
            return await self._in_flight(work, mode)

    async def _in_flight(self, work: Work[T], mode: Mode) -> T:
        call: _Call[T] = _Call()
        try:
            return await trio.to_thread.run_sync(
                _in_thread,
                self._conn,
                call,
                work,
                self.now(),
                mode,
                abandon_on_cancel=True,
                limiter=self.threads,
            )
        except trio.Cancelled:
            if not call.abandon():
                raise  # the thread never started: nothing ran
            # The thread runs on after Trio abandoned it: interrupt its statement and wait,
            # shielded, until it has rolled back and let go of the connection, so the next
            # call finds it usable and outside any transaction.
            with trio.CancelScope(shield=True):
                while not call.finished.is_set():
                    self._conn.interrupt()
                    with trio.move_on_after(_INTERRUPT_AGAIN):
                        await call.finished.wait()
            if isinstance(call.result, outcome.Value):
                committed: T = call.result.value
                return committed
            raise

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[sqlite3.Connection]:
        """The connection for as long as the block runs, every other call waiting its turn: the
        caller's own transaction (``jobs_trio.transaction(driver)``) runs on it."""
        self.check_open()
        async with self._lock:
            self.check_open()
            yield self._conn

    def error(self, exc: sqlite3.Error) -> Exception:
        """The error a caller sees for what SQLite raised on this file."""
        return file_error(self.path, exc)

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        # Shielded: the connection must be closed even by a cancelled caller, and only once the
        # call in flight (if any) has let go of it.
        with trio.CancelScope(shield=True):
            async with self._lock:
                await trio.to_thread.run_sync(self._conn.close, limiter=self.threads)


def file_error(path: str, exc: sqlite3.Error) -> Exception:
    """The error a caller sees for what SQLite raised on the file at ``path`` (the driver's,
    a producer's)."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if _not_a_database(exc):
        return ConfigError(
            f"{path!r} is not a usable SQLite database ({exc})",
            fix="point the URL at a new file, or restore this one from a backup",
        )
    if code in _CANNOT_WRITE:
        # Trying again changes nothing: the file, its folder or this connection is
        # read-only, and stays so until someone changes it.
        return ConfigError(
            f"cannot write to the SQLite database {path!r}: {exc}",
            fix="make the file and its folder writable by this user (SQLite writes -wal"
            " and -shm files beside it); show, list and stats need only to read it",
        )
    if getattr(exc, "sqlite_errorcode", 0) == _BUSY_SNAPSHOT:
        # Raised at once, never waited for: a transaction that read the file before another
        # connection wrote it cannot write on that older snapshot.
        return DriverError(
            f"the transaction on {path!r} read the file before another connection wrote it, and"
            f" cannot write on what it read: {exc}",
            fix="roll the transaction back and run it again from its start; retrying this call"
            " inside it fails the same way (BEGIN IMMEDIATE takes the write lock before reading)",
        )
    if _is_busy(exc):
        # A connection's own busy timeout ran out (a producer's, an application's): not a disk
        # fault, another writer holding the file.
        return DriverError(
            f"{path!r} stayed locked by another connection past the busy timeout: {exc}",
            fix="look for a process holding a long write transaction on this file (a CLI, a"
            " backup, a DB browser, a transaction left open), or raise the busy timeout"
            " (busy_timeout=, or sqlite3.connect's timeout= for your own connection)",
        )
    if code == sqlite3.SQLITE_ERROR:
        # SQLite refused the statement itself (no such table, a limit of its own): the disk
        # is not at fault, and a retry fails the same way. A claim over 300 queues said "check
        # the disk" here, which sent its reader the wrong way.
        return DriverError(
            f"SQLite refused a statement on {path!r}: {exc}",
            fix="not a disk fault, and a retry fails the same way: a missing table or column"
            " means the file was made by another program or an older jobs_trio (`jobs-trio"
            " migrate --db URL`); anything else is a jobs_trio bug, to report with this message",
        )
    return DriverError(
        f"SQLite failed on {path!r}: {exc}",
        fix="check the disk (space, permissions) and the file; the call can be retried",
    )


# The thread side of one call.


class _RolledBack(Exception):
    """The call was cancelled before its COMMIT: the transaction was rolled back instead."""


class _Call(Generic[T]):
    """One unit of work handed to a worker thread, and the handshake a cancel relies on.

    Trio may raise Cancelled before the thread has even started (while it waits for a thread
    token); then nothing must wait for a thread that will never report. ``_mutex`` makes
    "started" and "abandoned" exclusive: whichever comes first decides.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._started = False
        self.cancelled = False  # set on the Trio thread; the worker reads it before COMMIT
        self.finished = trio.Event()
        self.result: outcome.Outcome[T] | None = None
        self._token = trio.lowlevel.current_trio_token()

    def start(self) -> bool:
        """Thread side: False when the call was abandoned before it began (touch nothing)."""
        with self._mutex:
            self._started = not self.cancelled
            return self._started

    def abandon(self) -> bool:
        """Trio side, on cancel: True when a thread runs (or ran) it and must be waited for."""
        with self._mutex:
            self.cancelled = True
            return self._started

    def finish(self, result: outcome.Outcome[T]) -> None:
        self.result = result
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self.finished.set)


def _rollback(conn: sqlite3.Connection) -> None:
    # Two tries: our own re-interrupt can land on the first ROLLBACK, and an open transaction
    # left behind would make the next BEGIN fail.
    for _ in range(2):
        if not conn.in_transaction:
            return
        with contextlib.suppress(sqlite3.OperationalError):
            conn.execute("ROLLBACK")


def file_identity(path: str) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path`` now; None when there is none. A stat, never
    an open: closing a descriptor of the file would drop the process's SQLite locks on it."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino)


def remember_file(conn: sqlite3.Connection, path: str) -> None:
    """Note on ``conn`` (a DoorConnection just opened) which file ``path`` named: made absolute
    from the working directory, as a job body's chdir must not make it another, but not
    normalised (``data/../jobs.db`` through a symlinked ``data`` is not ``jobs.db``, and the
    check looked at a file SQLite never opened). No file to be found there: nothing to check."""
    if isinstance(conn, DoorConnection):
        absolute = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        found = file_identity(absolute)
        conn.opened = None if found is None else (absolute, found)


def moved_away(conn: sqlite3.Connection) -> str | None:
    """The path of the file ``conn`` opened when it is no longer the one there (else None):
    replaced (a restore, a deploy that copies a database in) or deleted. SQLite does not say: in
    WAL mode it goes on writing to the unlinked file, and every commit after is lost when the
    connection closes."""
    return moved_from(conn.opened if isinstance(conn, DoorConnection) else None)


def moved_from(opened: tuple[str, tuple[int, int]] | None) -> str | None:
    """``opened``'s path when the file there is not the one it names (``remember_file``)."""
    if opened is None or file_identity(opened[0]) == opened[1]:
        return None
    return opened[0]


def moved_error(path: str) -> ConfigError:
    return ConfigError(
        f"the SQLite database {path!r} was replaced or deleted after this process opened it:"
        " what it would write now goes to a file no one else reads, and is lost when it exits",
        fix="restart the process on the file now at that path (a worker's running jobs are"
        " handed back by their leases in the old file, not the new one); to move a database,"
        " stop its workers first",
    )


def _run_transaction(
    conn: sqlite3.Connection, call: _Call[T], work: Work[T], now: float, mode: Mode
) -> T:
    _rollback(conn)  # a transaction some earlier failure left open (see _rollback)
    moved = moved_away(conn)
    if moved is not None:
        # Before anything is written: a claim, a completion or an enqueue committed to the
        # unlinked file would be answered as done and lost. The idle look (bare) too: a worker
        # listening to the old file never hears of the new one's jobs.
        raise moved_error(moved)
    if mode == "bare":
        return work(conn, now)
    conn.execute("BEGIN IMMEDIATE" if mode == "write" else "BEGIN")
    try:
        answer = work(conn, now)
        # Checked last: a cancel that arrived while the work ran rolls it back, so a caller
        # that sees Cancelled knows nothing was written.
        if call.cancelled:
            raise _RolledBack
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return answer


def _in_thread(
    conn: sqlite3.Connection, call: _Call[T], work: Work[T], now: float, mode: Mode
) -> T:
    if not call.start():
        raise _RolledBack
    result = outcome.capture(_run_transaction, conn, call, work, now, mode)
    call.finish(result)
    if isinstance(conn, DoorConnection):
        conn.letting_go()  # the loop waiting to lend the GIL goes on: the thread is done
    return result.unwrap()


# SQLITE_BUSY_SNAPSHOT (extended code): sqlite3 has no name for it before Python 3.12's.
_BUSY_SNAPSHOT = sqlite3.SQLITE_BUSY | (2 << 8)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _not_a_database(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)
