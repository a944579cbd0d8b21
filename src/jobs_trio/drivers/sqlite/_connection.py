# The SQLite driver's connection: its door to the file (a thread per statement), its transactions,
# its clock and wake-ups. Apart because every capability writes through it and holds no state.
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from typing import Final, TypeVar

import attrs
import trio

from ..._core.errors import ConfigError
from ..._core.records import AttemptRecord
from .._sqlite_door import Mode, SqliteDoor, Work
from .._sqlite_enqueue import caller_error, refuse_another_file, write_in
from .._transaction import SqliteOps, Transaction, owned

T = TypeVar("T")


# How long wait_for_work sleeps before looking at the file again when nothing is due. SQLite has
# no cross-process notification: a job another process enqueues is seen at the next look, so
# this is the worst-case pickup delay across processes (this process's own writes wake at once).
POLL_INTERVAL: Final = 0.5
# How often a waiter (for work, for pauses) reads the file's data version: the most another
# process's commit waits before a waiting worker of this one looks at what it wrote.
CHANGE_LOOK: Final = 0.1


def data_version(conn: sqlite3.Connection) -> int:
    """A number that changes whenever another connection commits to the file (PRAGMA
    data_version, read from WAL's shared index: no disk read); this connection's own commits
    leave it as it is (they wake this driver's waiters themselves)."""
    version: int = conn.execute("PRAGMA data_version").fetchone()[0]
    return version


def _data_version_now(conn: sqlite3.Connection, now: float) -> int:
    return data_version(conn)


_ATTEMPT_FIELDS: Final = tuple(field.name for field in attrs.fields(AttemptRecord))


_ATTEMPT_COLUMNS: Final = ", ".join(_ATTEMPT_FIELDS)


# Fencing: a write of a run applies only while its claim is the job's current one.
_FENCE: Final = "id = ? AND token = ? AND state = 'running'"


def _paused(conn: sqlite3.Connection) -> set[str]:
    """The paused queues, read in the caller's transaction: a claim's reads them under its
    write lock, so it is ordered before or after a pause, never beside it."""
    return {row[0] for row in conn.execute("SELECT queue FROM queue_pauses")}


class SqliteConnection:
    """The SQLite driver's one connection layer, which every capability writes through."""

    def __init__(self, door: SqliteDoor, *, url: str, poll_interval: float = POLL_INTERVAL) -> None:
        self.url = url
        self.path = door.path
        self._door = door
        self._poll_interval = poll_interval
        self._lot = trio.lowlevel.ParkingLot()
        # Bumped by every wake-up, so a waiter that looked at the file while a write of this
        # driver was landing does not then sleep through that write's wake-up.
        self._wakes = 0
        # The same for pauses and resumes (wait_for_pauses): apart, so that a worker's watch on
        # its queues' pauses does not look again at every enqueue of its process.
        self._pause_lot = trio.lowlevel.ParkingLot()
        self._pause_changes = 0

    @property
    def _conn(self) -> sqlite3.Connection:
        return self._door.conn

    def now(self) -> float:
        return self._door.now()

    def _wake(self) -> None:
        self._wakes += 1
        self._lot.unpark_all()

    def _pause_changed(self) -> None:
        self._pause_changes += 1
        self._pause_lot.unpark_all()

    async def _await_wake_up(self, lot: trio.lowlevel.ParkingLot, version: int) -> None:
        """Return once ``lot`` is unparked (a write of this driver's) or another connection
        has committed to the file since ``version`` was read (its data version moved), looking
        every ``CHANGE_LOOK``; the caller bounds the wait. A look at the data version is cheap
        where a look for work is not: an enqueue from a web app's process waited up to
        poll_interval (0.5 s) before a worker of another process saw it. Named for the
        packaged conformance suite, which finds a waiter parked here (helpers.WAKE_UP)."""
        while True:
            with trio.move_on_after(CHANGE_LOOK):
                await lot.park()
                return
            if await self._transact(_data_version_now, mode="bare") != version:
                return

    async def _transact(self, work: Work[T], *, mode: Mode = "write") -> T:
        """The door every call goes through: ``work(conn, now)`` in one transaction in a
        worker thread (_sqlite_door.py says how a cancel and a busy file are handled)."""
        return await self._door.transact(work, mode=mode)

    # The caller's transaction.

    @contextlib.asynccontextmanager
    async def open_transaction(self) -> AsyncIterator[Transaction]:
        """A transaction on the driver's own connection, for ``jobs_trio.transaction(driver)``:
        the application's SQL (``tx.execute``) and the jobs it enqueues commit together. Every
        other call of this driver waits for the block to end, as SQLite has one writer: keep
        the block short."""
        async with self._door.held() as conn:
            ops = SqliteOps(
                conn,
                limiter=self._door.threads,
                busy_timeout=self._door.busy_timeout,
                lending=self._door.lending,
            )
            async with owned(Transaction(conn, ops)) as tx:
                yield tx

    async def _on_callers(
        self, connection: object, tx: Transaction | None, work: Work[T], *, wake: bool
    ) -> T:
        """Run ``work`` on the caller's connection, inside its transaction (a savepoint, so a
        failure here undoes only these writes), or in one of its own when it has none."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigError(
                f"connection= must be a sqlite3 connection to {self.path!r}, not"
                f" {type(connection).__name__}",
                fix="pass the sqlite3 connection your transaction runs on, or open the"
                " transaction with jobs_trio.transaction(conn)",
            )
        own = connection is self._conn
        now = self.now()

        def run() -> T:
            if not own:
                refuse_another_file(connection, self.path)
            return write_in(connection, lambda conn: work(conn, now))

        try:
            # The driver's own connection (jobs_trio.transaction(driver)) keeps to the driver's
            # one thread token; an application's connection is the application's to pace. In a
            # block, one statement at a time: a savepoint's writes must not interleave another
            # task's statements of the same block.
            async with contextlib.nullcontext() if tx is None else tx.lock:
                with self._door.lending() if own else contextlib.nullcontext():
                    answer = await trio.to_thread.run_sync(
                        run, limiter=self._door.threads if own else None
                    )
        except Exception as exc:
            mapped = caller_error(self.path, exc)
            if mapped is None:
                raise
            raise mapped from exc
        if wake:
            if tx is not None and tx.owned:
                # After the commit, not now: a worker woken before it finds nothing to claim.
                tx.after_commit(self._wake)
            else:
                self._wake()
        return answer

    async def aclose(self) -> None:
        if self._door.closed:
            return
        self._wake()  # a waiter's next call hears the door is closed (before any checkpoint)
        self._pause_changed()
        await self._door.aclose()
