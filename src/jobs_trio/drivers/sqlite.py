# The SQLite driver: the whole contract on one WAL database file that worker processes on one
# machine share. Apart because every call must leave the Trio thread and a cancelled call must
# leave its connection usable; both happen in `SqliteDriver._transact`, the door every method uses.
# Internal: not part of the public API (docs/reference.md lists the public modules).
from __future__ import annotations

import contextlib
import importlib.resources
import json
import math
import os
import pathlib
import random
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final, Generic, Literal, TypeVar

import attrs
import outcome
import trio

from ..claim_slots import ClaimSlots
from ..current_transaction import SqliteOps, Transaction, owned, unwrap
from ..errors import (
    ConfigError,
    DriverError,
    SchemaVersionError,
    ValueRefused,
)
from ..fleet_stats import decode as decode_fleet_stats
from ..fleet_stats import encode as encode_fleet_stats
from ..operator_transitions import (
    OPERATOR_CANCEL_ERROR,
    cancel_flags_only,
    cancel_instead,
    check_retry,
    found,
    key_held,
)
from ..records import (
    Claim,
    Enqueued,
    EventRecord,
    JobId,
    JobLimits,
    JobRecord,
    JobState,
    Lease,
    NewJob,
    OutboxStats,
    Pruned,
    PruneTurn,
    QueueStats,
    RenewResult,
    Settlement,
    StepRecord,
    StepStatus,
    TaskAdvance,
    TaskMark,
    outbox_job,
)
from ..retention import DEAD_STATE, FINISHED_STATES, cutoffs, turn_is_free
from .limit_rules import SLOT, LimitRow, decide, needs, waiting_on
from .rules import (
    FIRE_HISTORY,
    JOB_COLUMNS,
    LAPSED_ERROR,
    LIVE_STATES_SQL,
    driver_closed,
    effect,
    job_record,
    lapsed_out_of_attempts,
    queue_stats,
    refuse_connection,
)

T = TypeVar("T")

# Written into the file header (PRAGMA application_id): how a file says it is a jobs_trio
# database, so a file of another application is refused instead of having tables added to it.
APPLICATION_ID: Final = 0x4A54524F  # "JTRO"

# RETURNING (3.35) is used by claim, renew and save_step.
MIN_SQLITE: Final = (3, 35, 0)

# How long wait_for_work sleeps before looking at the file again when nothing is due. SQLite has
# no cross-process notification: a job another process enqueues is seen at the next look, so
# this is the worst-case pickup delay across processes (this process's own writes wake at once).
POLL_INTERVAL: Final = 0.5

# SQLite's own busy handler cannot be interrupted (sqlite3_interrupt does not reach it), so it
# is given at most this long per try; the rest of busy_timeout is waited out from Trio, where a
# cancel is heard.
_BUSY_SLICE: Final = 0.1
# After busy_timeout has passed, a few more tries with a growing pause before giving up: a
# writer that held the file a little too long should cost a delay, not a crashed worker.
_BUSY_RETRIES: Final = 4
_BUSY_BACKOFF: Final = 0.05

# A cancelled call re-interrupts its statement this often until the thread has let go: an
# interrupt that lands between two statements of a transaction is a no-op in SQLite.
_INTERRUPT_AGAIN: Final = 0.05

_SQLITE_HEADER: Final = b"SQLite format 3\x00"
_SYNCHRONOUS: Final = ("OFF", "NORMAL", "FULL", "EXTRA")

Mode = Literal["read", "write", "bare"]  # BEGIN, BEGIN IMMEDIATE, or no transaction at all
Work = Callable[[sqlite3.Connection, float], T]  # gets the connection and the driver's now


# The migrations: numbered .sql files beside this module; the schema version is the last number.


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


def _load_migrations() -> list[tuple[int, list[str]]]:
    folder = importlib.resources.files(__package__ or "jobs_trio.drivers") / "sqlite_migrations"
    found = sorted(
        (int(entry.name.split("_", 1)[0]), _statements(entry.read_text(encoding="utf-8")))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    numbers = [number for number, _ in found]
    # Increasing and unique, starting at 1; a gap is allowed (branches number their migrations
    # apart and meet later), a repeat never: it would say two schemas are one version.
    if not numbers or numbers[0] != 1 or len(set(numbers)) != len(numbers):
        raise RuntimeError(f"SQLite migrations must be numbered 1, 2, 3...; found {numbers}")
    return found


MIGRATIONS: Final = _load_migrations()
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


def _refuse_a_file_that_is_not_sqlite(path: str) -> None:
    """Read the header ourselves: SQLite would only notice at the first statement, and the WAL
    switch that follows would be a write to somebody else's file."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return  # a new database
    except OSError as exc:
        raise ConfigError(
            f"cannot read the SQLite database file {path!r}: {exc}",
            fix="check the path and its permissions",
        ) from exc
    if head and head != _SQLITE_HEADER:
        raise ConfigError(
            f"{path!r} is not a SQLite database (it does not start with the SQLite header); "
            "it was left untouched",
            fix="point the URL at a new file or at an existing jobs_trio database",
        )


def _connect(path: str, busy_timeout: float, read_only: bool, create: bool) -> sqlite3.Connection:
    if read_only or not create:
        _refuse_a_missing_file(path)
    _refuse_a_file_that_is_not_sqlite(path)
    if not read_only:
        _create_for_owner_only(path)
    try:
        conn = sqlite3.connect(
            # mode=ro: SQLite itself refuses every write, and never creates the file.
            pathlib.Path(path).absolute().as_uri() + "?mode=ro" if read_only else path,
            timeout=min(busy_timeout, _BUSY_SLICE),
            # isolation_level=None: the module issues no BEGIN of its own; every transaction
            # here is an explicit BEGIN / BEGIN IMMEDIATE in `_run_transaction`.
            isolation_level=None,
            # One connection, used by one worker thread at a time (under the driver's lock),
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


# The thread side of one call.


class _RolledBack(Exception):
    """The call was cancelled before its COMMIT: the transaction was rolled back instead."""


class _FireTaken(Exception):
    """A fire of this task and scheduled time is already on record: roll the advance back."""


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


def _run_transaction(
    conn: sqlite3.Connection, call: _Call[T], work: Work[T], now: float, mode: Mode
) -> T:
    _rollback(conn)  # a transaction some earlier failure left open (see _rollback)
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
    return result.unwrap()


# What SQLite (or its Python binding, while binding the arguments) raises for the VALUES of a
# write: a lone surrogate, an int past 64 bits, a string or blob past SQLITE_LIMIT_LENGTH,
# a constraint (NOT NULL for a NaN, a trigger's RAISE).
_REFUSED: Final = (
    UnicodeError,
    OverflowError,
    sqlite3.DataError,
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


# Errors no retry can cure: a read-only file or folder (or a connection opened read-only), no
# permission, a file that cannot be opened.
_CANNOT_WRITE: Final = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN)


def _not_a_database(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)


# Rows to records.

# Column names are the record's field names, so a row maps onto its record by name (the job's:
# rules.JOB_COLUMNS).
_STEP_FIELDS: Final = (
    "name", "status", "started_at", "finished_at", "result", "wake_at", "event", "match",
)  # fmt: skip
_STEP_COLUMNS: Final = ", ".join(_STEP_FIELDS)
_EVENT_COLUMNS: Final = "id, name, key, payload, created_at"
# Fencing: a write of a run applies only while its claim is the job's current one.
_FENCE: Final = "id = ? AND token = ? AND state = 'running'"


def _step(row: Sequence[Any]) -> StepRecord:
    fields = dict(zip(_STEP_FIELDS, row, strict=True))
    fields["status"] = StepStatus(fields["status"])
    return StepRecord(**fields)


def _event(row: Any) -> EventRecord:
    return EventRecord(id=str(row[0]), name=row[1], key=row[2], payload=row[3], created_at=row[4])


def _job_or_raise(conn: sqlite3.Connection, job_id: JobId) -> JobRecord:
    row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return job_record(found(row, job_id))


def _queue_stats(conn: sqlite3.Connection, now: float) -> list[QueueStats]:
    return queue_stats(
        conn.execute("SELECT queue, state, count(*) FROM jobs GROUP BY queue, state"),
        conn.execute(
            "SELECT queue, count(*), min(run_at) FROM jobs"
            " WHERE state = 'ready' AND run_at <= ? GROUP BY queue",
            (now,),
        ),
        now,
        conn.execute(
            "SELECT queue, name, substr(waiting_on, 1, 4), count(*) FROM jobs"
            " WHERE waiting_on IS NOT NULL AND state IN ('ready', 'suspended')"
            " GROUP BY queue, name, substr(waiting_on, 1, 4)"
        ),
    )


def _settle_one(conn: sqlite3.Connection, s: Settlement, now: float) -> bool:
    """One fenced UPDATE; True when the lease's token was still the job's current one."""
    instead = cancel_instead(s)
    # An operator's pending cancel turns an ending that would leave the job live into a cancel;
    # tried first, fenced and only where the flag is set, in the batch's one transaction.
    if instead is not None and _write_settlement(conn, instead, now, " AND cancel_requested = 1"):
        return True
    return _write_settlement(conn, s, now)


def _write_settlement(conn: sqlite3.Connection, s: Settlement, now: float, also: str = "") -> bool:
    change = effect(s)
    # Column names are rules' own record field names, never a caller's text.
    written: dict[str, object] = {"state": change.state.value, **change.writes}
    if change.delay is not None:
        written["run_at"] = now + max(change.delay, 0.0)
    changes = ", ".join(f"{column} = ?" for column in written)
    row = conn.execute(
        f"UPDATE jobs SET {changes}, attempts = attempts - ?, lease_until = NULL,"
        f" worker_id = NULL, cancel_requested = 0, token = NULL, updated_at = ?"
        f" WHERE {_FENCE}{also} RETURNING slot_key",
        (*written.values(), int(change.hands_back), now, s.lease.job_id, s.lease.token),
    ).fetchone()
    if row is None:
        return False
    if row[0] is not None:
        _release_slot(conn, s.lease.token, now)
    return True


def _release_slot(conn: sqlite3.Connection, token: str, now: float) -> None:
    """In the settle's transaction: the run's slot row is free, and the first job a claim put
    off waiting on that slot is due now."""
    for (key,) in conn.execute(
        "UPDATE limit_rows SET until = NULL, token = NULL, job_id = NULL"
        " WHERE kind = 'slot' AND token = ? RETURNING key",
        (token,),
    ).fetchall():
        conn.execute(
            "UPDATE jobs SET run_at = ?, updated_at = ? WHERE id = (SELECT id FROM jobs"
            " INDEXED BY jobs_waiting_on WHERE waiting_on = ? AND state IN ('ready', 'suspended')"
            " AND run_at > ? ORDER BY priority, run_at, id LIMIT 1)",
            (now, now, waiting_on(SLOT, key), now),
        )


def _limit_columns(limits: JobLimits | None) -> tuple[object, ...]:
    """slot_key, slots, rate_key, starts, per: all NULL for a job without limits."""
    if limits is None:
        return (None,) * 5
    return attrs.astuple(limits)


def _insert_jobs(conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float) -> list[Enqueued]:
    """Write ``jobs`` (enqueue's rows); answer each one's id, or its key holder's."""
    # A job whose key a live job holds is skipped by the partial unique index; who
    # holds each key is read back afterwards (also when the holder came earlier in
    # this same batch).
    conn.executemany(
        "INSERT INTO jobs (id, name, queue, state, payload, priority, attempts,"
        " max_attempts, run_at, created_at, updated_at, key, slot_key, slots, rate_key, starts,"
        " per) VALUES (?, ?, ?, 'ready', ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        f" ON CONFLICT (key) WHERE key IS NOT NULL AND state IN {LIVE_STATES_SQL} DO NOTHING",
        [
            (
                job.job_id,
                job.name,
                job.queue,
                job.payload,
                job.priority,
                job.max_attempts,
                now + max(job.delay, 0.0),
                now,
                now,
                job.key,
                *_limit_columns(job.limits),
            )
            for job in jobs
        ],
    )
    holders: dict[str, JobId] = {}
    for key in {job.key for job in jobs if job.key is not None}:
        row = conn.execute(
            f"SELECT id FROM jobs WHERE key = ? AND state IN {LIVE_STATES_SQL}", (key,)
        ).fetchone()
        holders[key] = row[0]
    return [
        Enqueued(job.job_id, created=True)
        if job.key is None
        else Enqueued(holders[job.key], created=holders[job.key] == job.job_id)
        for job in jobs
    ]


def _claim_limited(
    conn: sqlite3.Connection, ids: Sequence[JobId], now: float, lease: float, worker_id: str
) -> dict[JobId, Any]:
    """Claim what the limits allow of ``ids`` (claim order), put the rest off; answer the
    granted rows as claim()'s RETURNING gives them. Under BEGIN IMMEDIATE: no other claim reads
    the limit rows meanwhile, so a row never written is simply free."""
    found = {
        row[0]: JobLimits(*row[1:])
        for row in conn.execute(
            "SELECT id, slot_key, slots, rate_key, starts, per FROM jobs"
            " WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(ids)),),
        )
    }
    candidates = [(job_id, found[job_id]) for job_id in ids]
    keys = {(kind, key) for _, limits in candidates for kind, key, _ in needs(limits)}
    rows = {
        (kind, key): [
            LimitRow(*row)
            for row in conn.execute(
                "SELECT kind, key, n, until, token, job_id FROM limit_rows"
                " WHERE kind = ? AND key = ?",
                (kind, key),
            )
        ]
        for kind, key in keys
    }
    decision = decide(candidates, rows, now=now, lease=lease, missing_is_free=True)
    conn.executemany(
        "INSERT INTO limit_rows (kind, key, n, until, token, job_id) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (kind, key, n) DO UPDATE SET until = excluded.until,"
        " token = excluded.token, job_id = excluded.job_id",
        [attrs.astuple(row) for row in decision.taken],
    )
    # A lapsed job put off goes back to ready, its lapse recorded (its attempt stays counted).
    conn.executemany(
        "UPDATE jobs SET run_at = ?, waiting_on = ?, updated_at = ?,"
        " last_error = CASE WHEN state = 'running' THEN ? ELSE last_error END,"
        " state = CASE WHEN state = 'running' THEN 'ready' ELSE state END,"
        " token = NULL, lease_until = NULL, worker_id = NULL WHERE id = ?",
        [
            (run_at, waits, now, LAPSED_ERROR, job_id)
            for job_id, (run_at, waits) in decision.put_off.items()
        ],
    )
    granted: dict[JobId, Any] = {}
    for job_id, token in decision.granted.items():
        granted[job_id] = conn.execute(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_until = ?,"
            " worker_id = ?, token = ?, wait_event = NULL, waiting_on = NULL,"
            " last_error = CASE WHEN state = 'running' THEN ? ELSE last_error END,"
            " updated_at = ? WHERE id = ?"
            " RETURNING id, token, name, queue, payload, attempts, max_attempts",
            (now + lease, worker_id, token, LAPSED_ERROR, now, job_id),
        ).fetchone()
    return granted


class SqliteDriver:
    """Jobs in one SQLite file, reached through one connection that one worker thread at a time
    uses. Open it with `open_sqlite_driver`, which prepares the schema and closes it after."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        url: str,
        path: str,
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 5.0,
        poll_interval: float = POLL_INTERVAL,
        synchronous: str = "FULL",
    ) -> None:
        self.url = url
        self.path = path
        self._conn = conn
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._poll_interval = poll_interval
        self._synchronous = synchronous
        # One connection: one call on it at a time. Trio's lock is FIFO, so calls run in the
        # order they were made.
        self._lock = trio.Lock()
        # The driver's own thread token, not Trio's default limiter: abandoned sync job bodies
        # keep their tokens until they return, and enough of them would otherwise leave no
        # thread for the settle and the close a drain depends on. One is all the lock allows.
        self._threads = trio.CapacityLimiter(1)
        self._lot = trio.lowlevel.ParkingLot()
        # Bumped by every wake-up, so a waiter that looked at the file while a write of this
        # driver was landing does not then sleep through that write's wake-up.
        self._wakes = 0
        self._closed = False

    def now(self) -> float:
        return self._clock()

    def _check_open(self) -> None:
        if self._closed:
            raise driver_closed("SQLite")

    def _wake(self) -> None:
        self._wakes += 1
        self._lot.unpark_all()

    # The door every call goes through.

    async def _transact(self, work: Work[T], *, mode: Mode = "write") -> T:
        """Run ``work(conn, now)`` in a worker thread inside one transaction (BEGIN IMMEDIATE
        for writes, so two processes never both claim a job), and commit it.

        A lock held by another connection is waited out for ``busy_timeout`` and then a few
        more tries; only then does a `DriverError` surface. A cancel interrupts the statement
        and rolls the transaction back: Cancelled then means nothing was written. If the COMMIT
        had already happened when the cancel arrived, the answer is returned instead, and the
        cancel lands at the caller's next checkpoint.
        """
        self._check_open()
        started = time.monotonic()
        retries = 0
        async with self._lock:
            while True:
                self._check_open()  # aclose() may have run while this call waited its turn
                try:
                    return await self._run_in_thread(work, mode)
                except _REFUSED as exc:
                    # Rolled back already (_run_transaction): the file is as it was, and the
                    # same values would be refused again, so this is not worth a retry.
                    raise ValueRefused(
                        f"SQLite refused a write to {self.path!r}: {type(exc).__name__}: {exc}",
                        fix="the value cannot be stored as it is: check the text and numbers"
                        " this write carries (a lone surrogate, a value past a limit)",
                    ) from exc
                except sqlite3.Error as exc:
                    if not _is_busy(exc):
                        raise self._driver_error(exc) from exc
                    if time.monotonic() - started < self._busy_timeout:
                        continue  # SQLite waited one slice; wait another, from here
                    if retries == _BUSY_RETRIES:
                        raise DriverError(
                            f"{self.path!r} stayed locked by another connection for"
                            f" {time.monotonic() - started:.1f} s (busy_timeout"
                            f" {self._busy_timeout} s, then {retries} more tries)",
                            fix="look for a process holding a long write transaction on this"
                            " file (a CLI, a backup, a DB browser), or raise busy_timeout",
                        ) from exc
                    retries += 1
                    pause = _BUSY_BACKOFF * 2**retries
                    await trio.sleep(pause * random.uniform(0.5, 1.0))

    async def _run_in_thread(self, work: Work[T], mode: Mode) -> T:
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
                limiter=self._threads,
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

    def _driver_error(self, exc: sqlite3.Error) -> Exception:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if _not_a_database(exc):
            return ConfigError(
                f"{self.path!r} is not a usable SQLite database ({exc})",
                fix="point the URL at a new file, or restore this one from a backup",
            )
        if code in _CANNOT_WRITE:
            # Trying again changes nothing: the file, its folder or this connection is
            # read-only, and stays so until someone changes it.
            return ConfigError(
                f"cannot write to the SQLite database {self.path!r}: {exc}",
                fix="make the file and its folder writable by this user (SQLite writes -wal"
                " and -shm files beside it); show, list and stats need only to read it",
            )
        return DriverError(
            f"SQLite failed on {self.path!r}: {exc}",
            fix="check the disk (space, permissions) and the file; the call can be retried",
        )

    # Opening.

    async def _prepare(self, read_only: bool) -> None:
        if read_only:
            # Checked, never changed: a read-only open leaves the file exactly as it was.
            await self._transact(self._check_current, mode="read")
            return
        await self._transact(self._migrate, mode="write")
        await self._transact(self._use_wal, mode="bare")
        # Even this reads the file: it comes after the check that the file is ours.
        await self._transact(
            lambda conn, now: conn.execute(f"PRAGMA synchronous = {self._synchronous}"),
            mode="bare",
        )

    def _check_schema(self, conn: sqlite3.Connection) -> tuple[int, int]:
        """The file's (application_id, user_version), once it is known to be ours or new."""
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if app_id != APPLICATION_ID:
            tables = [
                row[0]
                for row in conn.execute(
                    "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
                )
            ]
            if tables or version or app_id:
                # Raised inside the transaction, before any write: the file stays as it was.
                shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
                raise ConfigError(
                    f"{self.path!r} is a SQLite database of another application"
                    f" (application_id {app_id}, user_version {version},"
                    f" tables: {shown or 'none'}); it was left untouched",
                    fix="point the URL at a new file: jobs_trio keeps its jobs in a file of"
                    " its own",
                )
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path!r} has jobs_trio schema version {version}, newer than the"
                f" {SCHEMA_VERSION} this jobs_trio knows: a newer release wrote it",
                fix="upgrade jobs_trio here to the release that wrote the file, or use"
                " another file",
            )
        return app_id, version

    def _check_current(self, conn: sqlite3.Connection, now: float) -> None:
        _, version = self._check_schema(conn)
        if version == 0:
            raise ConfigError(
                f"{self.path!r} is an empty SQLite file, not a jobs_trio database yet",
                fix="check the path; `jobs-trio migrate --db URL` makes it one",
            )
        if version < SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path!r} has jobs_trio schema version {version}, older than the"
                f" {SCHEMA_VERSION} this jobs_trio reads; a read-only open does not upgrade it",
                fix="run `jobs-trio migrate --db URL` once to upgrade it",
            )

    def _migrate(self, conn: sqlite3.Connection, now: float) -> None:
        app_id, version = self._check_schema(conn)
        for number, statements in MIGRATIONS:
            if number > version:
                for statement in statements:
                    conn.execute(statement)
        if app_id != APPLICATION_ID:
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        if version != SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _use_wal(self, conn: sqlite3.Connection, now: float) -> None:
        # After the schema check, never before: the switch writes the file header, and a
        # foreign file must be left as it was. Outside a transaction: SQLite requires it.
        journal = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(journal).lower() != "wal":
            raise ConfigError(
                f"{self.path!r} could not switch to WAL (journal mode stayed {journal!r})",
                fix="put the database on a local file system: WAL needs shared memory,"
                " which network file systems do not offer",
            )

    # Enqueue and claim.

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        jobs = list(jobs)
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> list[Enqueued]:
            return _insert_jobs(conn, jobs, now)

        if conn is not None:
            return await self._on_callers(conn, tx, work, wake=True)
        answers = await self._transact(work)
        self._wake()
        return answers

    async def claim(
        self,
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
    ) -> Sequence[Claim]:
        slots = ClaimSlots.of(queues, limit)

        def work(conn: sqlite3.Connection, now: float) -> list[Claim]:
            # Per queue and state, each read stops after `limit` rows in claim order (the
            # jobs_claim index); lapsed leases are few (at most the running jobs). The merge
            # is Python's sort, so the order is the memory driver's to the letter.
            # INDEXED BY: left to itself SQLite picks jobs_next_due (it also matches run_at)
            # and sorts every due row before the LIMIT: 3.8 ms a claim at 20,000 queued,
            # against 0.04 ms reading jobs_claim in order. And the lapsed leases by
            # (queue, state): once ANALYZE has run on a queue of ready jobs, its statistics say
            # `state = 'running'` matches every row, and SQLite scans the whole table instead
            # (37 ms a claim with 200,000 waiting; a worker fell from 1,100 to 150 jobs/s).
            candidates: list[Any] = []
            for queue, cap in slots.caps.items():
                for state in ("ready", "suspended"):
                    candidates += conn.execute(
                        "SELECT priority, run_at, id, state, attempts, max_attempts, queue,"
                        " slot_key IS NOT NULL OR rate_key IS NOT NULL"
                        " FROM jobs INDEXED BY jobs_claim"
                        " WHERE queue = ? AND state = ? AND run_at <= ?"
                        " ORDER BY priority, run_at, id LIMIT ?",
                        (queue, state, now, cap),
                    ).fetchall()
                candidates += conn.execute(
                    "SELECT priority, run_at, id, state, attempts, max_attempts, queue,"
                    " slot_key IS NOT NULL OR rate_key IS NOT NULL"
                    " FROM jobs INDEXED BY jobs_next_due"
                    " WHERE queue = ? AND state = 'running' AND lease_until <= ?",
                    (queue, now),
                ).fetchall()
            candidates.sort(key=lambda row: (row[0], row[1], row[2]))
            # Attempts are counted at claim, so a job that keeps killing its worker ends here
            # instead of looping forever. Up to `limit` of them per claim, apart from the
            # `limit` taken (the memory driver's rule): the rest stay lapsed for the next claim.
            exhausted = [row for row in candidates if row[3] == "running" and row[4] >= row[5]]
            dead = [
                (lapsed_out_of_attempts(row[4]), now, row[2]) for row in exhausted[: slots.total]
            ]
            skipped = {row[2] for row in exhausted}
            taken = slots.take((row[6], row[2]) for row in candidates if row[2] not in skipped)
            conn.executemany(
                "UPDATE jobs SET state = 'dead', lease_until = NULL, worker_id = NULL,"
                " token = NULL, last_error = ?, updated_at = ? WHERE id = ?",
                dead,
            )
            limited = {row[2] for row in candidates if row[7]}
            by_id: dict[str, Any] = {}
            if limited & set(taken):
                # Jobs with fleet limits: the shared rule decides them (limit_rules.py).
                by_id = _claim_limited(
                    conn, [i for i in taken if i in limited], now, lease, worker_id
                )
                taken = [i for i in taken if i not in limited or i in by_id]
            unlimited = [i for i in taken if i not in by_id]
            if not taken:
                return []
            # One UPDATE for the batch; each row draws its own fresh token.
            rows = conn.execute(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_until = ?,"
                " worker_id = ?, token = lower(hex(randomblob(12))), wait_event = NULL,"
                " last_error = CASE WHEN state = 'running' THEN ? ELSE last_error END,"
                " updated_at = ?"
                " WHERE id IN (SELECT value FROM json_each(?))"
                " RETURNING id, token, name, queue, payload, attempts, max_attempts",
                (now + lease, worker_id, LAPSED_ERROR, now, json.dumps(unlimited)),
            ).fetchall()
            by_id.update((row[0], row) for row in rows)
            return [
                Claim(
                    job_id=job_id,
                    token=by_id[job_id][1],
                    name=by_id[job_id][2],
                    queue=by_id[job_id][3],
                    payload=by_id[job_id][4],
                    attempt=by_id[job_id][5],
                    max_attempts=by_id[job_id][6],
                    lease_until=now + lease,
                )
                for job_id in taken
            ]

        return await self._transact(work)

    # Writes of a run, fenced by its lease.

    async def renew(self, leases: Sequence[Lease], *, lease: float) -> RenewResult:
        pairs = json.dumps([[one.job_id, one.token] for one in leases])

        def work(conn: sqlite3.Connection, now: float) -> RenewResult:
            # One statement for every lease the worker holds; the row-value IN is the fence
            # (id, token, running) for all of them at once, searched by primary key.
            rows = conn.execute(
                "UPDATE jobs SET lease_until = ?, updated_at = ?"
                " WHERE state = 'running' AND (id, token) IN"
                " (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')"
                "  FROM json_each(?))"
                " RETURNING token, cancel_requested, slot_key IS NOT NULL",
                (now + lease, now, pairs),
            ).fetchall()
            with_slot = [row[0] for row in rows if row[2]]
            kept = set()
            if with_slot:
                # The slot rows renew with their runs; a run whose row another took has lost it.
                kept = {
                    row[0]
                    for row in conn.execute(
                        "UPDATE limit_rows SET until = ? WHERE kind = 'slot' AND token IN"
                        " (SELECT value FROM json_each(?)) RETURNING token",
                        (now + lease, json.dumps(with_slot)),
                    )
                }
            return RenewResult(
                held=frozenset(row[0] for row in rows),
                cancel_requested=frozenset(row[0] for row in rows if row[1]),
                slot_lost=frozenset(t for t in with_slot if t not in kept),
            )

        return await self._transact(work)

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        settlements = list(settlements)

        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            # In order, one transaction: a second settlement of the same lease in the batch
            # finds the token already cleared and applies nothing, as it would in two calls.
            return [s.lease.job_id for s in settlements if _settle_one(conn, s, now)]

        applied = await self._transact(work)
        self._wake()
        return applied

    async def save_step(self, lease: Lease, step: StepRecord) -> bool:
        def work(conn: sqlite3.Connection, now: float) -> bool:
            cursor = conn.execute(
                f"INSERT INTO steps (job_id, {_STEP_COLUMNS})"
                " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?"
                f" WHERE EXISTS (SELECT 1 FROM jobs WHERE {_FENCE})"
                " ON CONFLICT (job_id, name) DO UPDATE SET status = excluded.status,"
                " started_at = excluded.started_at, finished_at = excluded.finished_at,"
                " result = excluded.result, wake_at = excluded.wake_at,"
                " event = excluded.event, match = excluded.match",
                (
                    lease.job_id,
                    step.name,
                    step.status.value,
                    step.started_at,
                    step.finished_at,
                    step.result,
                    step.wake_at,
                    step.event,
                    step.match,
                    lease.job_id,
                    lease.token,
                ),
            )
            return cursor.rowcount == 1

        return await self._transact(work)

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]:
        def work(conn: sqlite3.Connection, now: float) -> list[StepRecord]:
            # rowid order: the order steps were first saved (an upsert keeps the row's rowid).
            rows = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM steps WHERE job_id = ? ORDER BY rowid", (job_id,)
            )
            return [_step(row) for row in rows]

        return await self._transact(work, mode="read")

    # Reads and operator actions.

    async def get(self, job_id: JobId) -> JobRecord | None:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord | None:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
            found = row.fetchone()
            return None if found is None else job_record(found)

        return await self._transact(work, mode="read")

    async def list_jobs(
        self, *, state: JobState | None = None, queue: str | None = None, limit: int = 100
    ) -> Sequence[JobRecord]:
        where, values = ["1"], list[object]()
        if state is not None:
            where.append("state = ?")
            values.append(state.value)
        if queue is not None:
            where.append("queue = ?")
            values.append(queue)

        def work(conn: sqlite3.Connection, now: float) -> list[JobRecord]:
            rows = conn.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)}"
                " ORDER BY created_at DESC, id DESC LIMIT ?",
                (*values, max(limit, 0)),
            )
            return [job_record(row) for row in rows]

        return await self._transact(work, mode="read")

    async def retry(self, job_id: JobId) -> JobRecord:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord:
            record = _job_or_raise(conn, job_id)
            check_retry(record)
            if (
                record.key is not None
                and conn.execute(
                    f"SELECT 1 FROM jobs WHERE key = ? AND state IN {LIVE_STATES_SQL} AND id != ?",
                    (record.key, job_id),
                ).fetchone()
            ):
                raise key_held(job_id, record.key)
            conn.execute(
                "UPDATE jobs SET state = 'ready', run_at = ?, attempts = 0,"
                " cancel_requested = 0, waiting_on = NULL, updated_at = ? WHERE id = ?",
                (now, now, job_id),
            )
            return _job_or_raise(conn, job_id)

        record = await self._transact(work)
        self._wake()
        return record

    async def cancel(self, job_id: JobId) -> JobRecord:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord:
            record = _job_or_raise(conn, job_id)
            values: tuple[object, ...]
            if cancel_flags_only(record):
                # Its worker hears it at the next renewal and cancels the run.
                changes, values = "cancel_requested = 1", ()
            else:
                changes, values = "state = 'cancelled', last_error = ?", (OPERATOR_CANCEL_ERROR,)
            conn.execute(
                f"UPDATE jobs SET {changes}, updated_at = ? WHERE id = ?", (*values, now, job_id)
            )
            return _job_or_raise(conn, job_id)

        return await self._transact(work)

    async def stats(self) -> Sequence[QueueStats]:
        return await self._transact(_queue_stats, mode="read")

    async def fleet_stats(self, worker_id: str, interval: float) -> Sequence[QueueStats]:
        def work(conn: sqlite3.Connection, now: float) -> list[QueueStats]:
            # The compare-and-set of the turn, under BEGIN IMMEDIATE: one process takes it.
            turn = conn.execute(
                "UPDATE fleet_stats SET taken_at = ?, worker_id = ?"
                " WHERE id = 1 AND (taken_at IS NULL OR taken_at <= ?) RETURNING id",
                (now, worker_id, now - interval),
            ).fetchone()
            if turn is None:
                (observed,) = conn.execute(
                    "SELECT observed FROM fleet_stats WHERE id = 1"
                ).fetchone()
                return decode_fleet_stats(observed)
            stats = _queue_stats(conn, now)
            conn.execute(
                "UPDATE fleet_stats SET observed = ? WHERE id = 1", (encode_fleet_stats(stats),)
            )
            return stats

        return await self._transact(work)

    async def prune(self, turn: PruneTurn) -> Pruned:
        def work(conn: sqlite3.Connection, now: float) -> Pruned:
            # The turn's compare-and-set and the batch in one BEGIN IMMEDIATE: two pruners
            # never delete at once, and a turn whose holder died frees itself after its hold.
            holder, held_until, ended_at = conn.execute(
                "SELECT holder, held_until, ended_at FROM prune_turn WHERE id = 1"
            ).fetchone()
            if not turn_is_free(turn, holder, held_until, ended_at, now):
                return Pruned(turn=False)
            finished_before, dead_before = cutoffs(turn, now)
            ages = [(state, finished_before) for state in FINISHED_STATES]
            if dead_before is not None:
                ages.append((DEAD_STATE, dead_before))
            doomed: list[str] = []
            for state, before in ages:
                # One state at a time, so each reads its own partial index (0007), oldest
                # first, and stops at the batch's limit.
                doomed += [
                    row[0]
                    for row in conn.execute(
                        f"SELECT id FROM jobs WHERE state = '{state.value}' AND updated_at < ?"
                        " ORDER BY updated_at LIMIT ?",
                        (before, turn.limit - len(doomed)),
                    )
                ]
                if len(doomed) >= turn.limit:
                    break
            # The ids as one JSON array: a batch of any size is one bound value.
            ids = json.dumps(doomed)
            for table, column in (("steps", "job_id"), ("jobs", "id")):
                conn.execute(
                    f"DELETE FROM {table} WHERE {column} IN (SELECT value FROM json_each(?))",
                    (ids,),
                )
            more = len(doomed) >= turn.limit
            if more:
                conn.execute(
                    "UPDATE prune_turn SET holder = ?, held_until = ? WHERE id = 1",
                    (turn.holder, now + turn.hold),
                )
            else:
                conn.execute(
                    "UPDATE prune_turn SET holder = NULL, held_until = NULL, ended_at = ?"
                    " WHERE id = 1",
                    (now,),
                )
            return Pruned(turn=True, deleted=len(doomed), more=more)

        return await self._transact(work)

    # Wake-ups.

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> None:
        """No cross-process notification exists in SQLite: this driver's own writes wake a
        waiter at once; another process's are seen at the next look, every ``poll_interval``."""
        wanted = list(dict.fromkeys(queues))

        def work(conn: sqlite3.Connection, now: float) -> float:
            soonest = math.inf
            # INDEXED BY: the lease look reads the queue's running rows, never the table (what
            # SQLite picks once ANALYZE has seen a queue of ready jobs, as in claim()).
            for queue in wanted:
                for sql in (
                    "SELECT min(run_at) FROM jobs INDEXED BY jobs_next_due"
                    " WHERE queue = ? AND state = 'ready'",
                    "SELECT min(run_at) FROM jobs INDEXED BY jobs_next_due"
                    " WHERE queue = ? AND state = 'suspended'",
                    "SELECT min(lease_until) FROM jobs INDEXED BY jobs_next_due"
                    " WHERE queue = ? AND state = 'running'",
                ):
                    (when,) = conn.execute(sql, (queue,)).fetchone()
                    if when is not None:
                        soonest = min(soonest, when - now)
            return soonest

        wakes = self._wakes
        due_in = await self._transact(work, mode="read")
        if due_in <= 0 or self._wakes != wakes:
            return
        with trio.move_on_after(min(timeout, due_in, self._poll_interval)):
            await self._lot.park()

    # Events.

    async def send_event(
        self, name: str, payload: str, *, key: str | None = None, connection: object | None = None
    ) -> str:
        refuse_connection(
            connection,
            driver="SQLite",
            fix="send the event without connection=, or use the PostgreSQL driver",
        )
        json.loads(payload)  # the boundary checked it; a driver never stores what it cannot read

        def work(conn: sqlite3.Connection, now: float) -> str:
            cursor = conn.execute(
                "INSERT INTO events (name, key, payload, created_at) VALUES (?, ?, ?, ?)",
                (name, key, payload, now),
            )
            conn.execute(
                "UPDATE jobs SET state = 'ready', run_at = ?, updated_at = ?"
                " WHERE state = 'suspended' AND wait_event = ?",
                (now, now, name),
            )
            return str(cursor.lastrowid)

        event_id = await self._transact(work)
        self._wake()
        return event_id

    async def find_event(
        self, name: str, *, key: str | None, since: float | None
    ) -> EventRecord | None:
        where, values = ["name = ?"], list[object]([name])
        if key is not None:
            where.append("key = ?")
            values.append(key)
        if since is not None:
            where.append("created_at >= ?")
            values.append(since)

        def work(conn: sqlite3.Connection, now: float) -> EventRecord | None:
            row = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)}"
                " ORDER BY id LIMIT 1",
                values,
            ).fetchone()
            return None if row is None else _event(row)

        return await self._transact(work, mode="read")

    # Cron tasks.

    async def task_marks(self) -> Sequence[TaskMark]:
        def work(conn: sqlite3.Connection, now: float) -> list[TaskMark]:
            rows = conn.execute(
                "SELECT task, handled_until, last_fired, last_fired_at, last_job_id"
                " FROM task_marks ORDER BY task"
            )
            return [TaskMark(*row) for row in rows]

        return await self._transact(work, mode="read")

    async def advance_task(self, advance: TaskAdvance) -> bool:
        def work(conn: sqlite3.Connection, now: float) -> bool:
            # BEGIN IMMEDIATE holds the file's write lock from the read on: no other process
            # can move the mark between this compare and the set below.
            row = conn.execute(
                "SELECT handled_until FROM task_marks WHERE task = ?", (advance.task,)
            ).fetchone()
            if (None if row is None else row[0]) != advance.expected:
                return False
            answers = _insert_jobs(conn, [f.job for f in advance.fires], now)
            for fire, answer in zip(advance.fires, answers, strict=True):
                taken = conn.execute(
                    "INSERT INTO task_fires (task, scheduled, job_id, fired_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (advance.task, fire.scheduled, answer.job_id, now),
                )
                if taken.rowcount != 1:
                    raise _FireTaken  # rolls back the jobs inserted above
            conn.execute(
                "DELETE FROM task_fires WHERE task = ? AND scheduled < (SELECT scheduled"
                " FROM task_fires WHERE task = ? ORDER BY scheduled DESC LIMIT 1 OFFSET ?)",
                (advance.task, advance.task, FIRE_HISTORY - 1),
            )
            last = (advance.fires[-1].scheduled, now, answers[-1].job_id) if answers else None
            conn.execute(
                "INSERT INTO task_marks (task, handled_until, last_fired, last_fired_at,"
                " last_job_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (task) DO UPDATE SET handled_until = excluded.handled_until,"
                " last_fired = coalesce(excluded.last_fired, last_fired),"
                " last_fired_at = coalesce(excluded.last_fired_at, last_fired_at),"
                " last_job_id = coalesce(excluded.last_job_id, last_job_id),"
                " updated_at = excluded.updated_at",
                (advance.task, advance.advance_to, *(last or (None, None, None)), now),
            )
            return True

        try:
            applied = await self._transact(work)
        except _FireTaken:
            return False
        self._wake()
        return applied

    # The caller's transaction.

    @contextlib.asynccontextmanager
    async def open_transaction(self) -> AsyncIterator[Transaction]:
        """A transaction on the driver's own connection, for ``jobs_trio.transaction(driver)``:
        the application's SQL (``tx.execute``) and the jobs it enqueues commit together. Every
        other call of this driver waits for the block to end, as SQLite has one writer: keep
        the block short."""
        self._check_open()
        async with self._lock:
            self._check_open()
            ops = SqliteOps(self._conn, limiter=self._threads, busy_timeout=self._busy_timeout)
            async with owned(Transaction(self._conn, ops)) as tx:
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
                self._refuse_another_file(connection)
            if not connection.in_transaction:
                connection.execute("BEGIN IMMEDIATE")
                try:
                    answer = work(connection, now)
                except BaseException:
                    connection.rollback()
                    raise
                connection.commit()
                return answer
            connection.execute("SAVEPOINT jobs_trio_write")
            try:
                answer = work(connection, now)
            except BaseException:
                connection.execute("ROLLBACK TO SAVEPOINT jobs_trio_write")
                connection.execute("RELEASE SAVEPOINT jobs_trio_write")
                raise
            connection.execute("RELEASE SAVEPOINT jobs_trio_write")
            return answer

        try:
            # The driver's own connection (jobs_trio.transaction(driver)) keeps to the driver's
            # one thread token; an application's connection is the application's to pace.
            answer = await trio.to_thread.run_sync(run, limiter=self._threads if own else None)
        except _REFUSED as exc:
            raise ValueRefused(
                f"SQLite refused a write in the caller's transaction on {self.path!r}:"
                f" {type(exc).__name__}: {exc}",
                fix="the value cannot be stored as it is; only this write was undone (a"
                " savepoint), the rest of the transaction is intact",
            ) from exc
        except sqlite3.ProgrammingError as exc:
            raise ConfigError(
                f"cannot write through the caller's sqlite3 connection: {exc}",
                fix="open it with sqlite3.connect(path, check_same_thread=False): jobs_trio"
                " runs its statements in worker threads",
            ) from exc
        except sqlite3.Error as exc:
            raise self._driver_error(exc) from exc
        if wake:
            if tx is not None and tx.owned:
                # After the commit, not now: a worker woken before it finds nothing to claim.
                tx.after_commit(self._wake)
            else:
                self._wake()
        return answer

    def _refuse_another_file(self, connection: sqlite3.Connection) -> None:
        # A write on a connection to another file would commit with THAT file's transaction
        # and never reach this driver's workers: the dual-write bug, silently.
        row = connection.execute("PRAGMA database_list").fetchone()
        there = row[2] if row else ""
        try:
            same = bool(there) and os.path.samefile(there, self.path)
        except OSError:
            same = False
        if not same:
            raise ConfigError(
                f"the sqlite3 connection is to {there or 'an in-memory database'!r}, not to"
                f" the driver's file {self.path!r}",
                fix="enqueue through a connection to the driver's own file; for another"
                " database, write to its outbox and run a relay (docs/transactions.md)",
            )

    # The outbox.

    async def outbox_write(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> None:
        jobs = list(jobs)
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.executemany(
                "INSERT INTO outbox (id, name, queue, payload, priority, max_attempts, key,"
                " run_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        job.job_id,
                        job.name,
                        job.queue,
                        job.payload,
                        job.priority,
                        job.max_attempts,
                        job.key,
                        now + max(job.delay, 0.0),
                        now,
                    )
                    for job in jobs
                ],
            )

        if conn is not None:
            await self._on_callers(conn, tx, work, wake=False)
        else:
            await self._transact(work)

    async def outbox_claim(self, limit: int, *, lease: float, relay_id: str) -> Sequence[NewJob]:
        def work(conn: sqlite3.Connection, now: float) -> list[NewJob]:
            # Under BEGIN IMMEDIATE: two relays (or processes) never take the same row while
            # its hold is live.
            rows = conn.execute(
                "UPDATE outbox SET claimed_until = ?, relay_id = ? WHERE seq IN"
                " (SELECT seq FROM outbox WHERE claimed_until IS NULL OR claimed_until <= ?"
                "  ORDER BY seq LIMIT ?)"
                " RETURNING seq, id, name, queue, payload, priority, max_attempts, key, run_at",
                (now + lease, relay_id, now, max(limit, 0)),
            ).fetchall()
            rows.sort()  # RETURNING promises no order: relay in the order written
            return [outbox_job(row[1:], now) for row in rows]

        return await self._transact(work)

    async def outbox_delete(self, job_ids: Sequence[JobId]) -> int:
        ids = json.dumps(list(job_ids))

        def work(conn: sqlite3.Connection, now: float) -> int:
            cursor = conn.execute(
                "DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(?))", (ids,)
            )
            return cursor.rowcount

        return await self._transact(work)

    async def outbox_stats(self) -> OutboxStats:
        def work(conn: sqlite3.Connection, now: float) -> OutboxStats:
            count, oldest = conn.execute("SELECT count(*), min(created_at) FROM outbox").fetchone()
            return OutboxStats(pending=count, oldest_age=None if oldest is None else now - oldest)

        return await self._transact(work, mode="read")

    async def enqueue_once(self, jobs: Sequence[NewJob]) -> Sequence[Enqueued]:
        jobs = list(jobs)
        ids = json.dumps([job.job_id for job in jobs])

        def work(conn: sqlite3.Connection, now: float) -> list[Enqueued]:
            # Under BEGIN IMMEDIATE: no other writer can store one of these ids between this
            # look and the insert.
            stored = {
                row[0]
                for row in conn.execute(
                    "SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(?))", (ids,)
                )
            }
            written = iter(_insert_jobs(conn, [j for j in jobs if j.job_id not in stored], now))
            return [
                Enqueued(job.job_id, created=False) if job.job_id in stored else next(written)
                for job in jobs
            ]

        answers = await self._transact(work)
        self._wake()
        return answers

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake()
        # Shielded: the connection must be closed even by a cancelled caller, and only once the
        # call in flight (if any) has let go of it.
        with trio.CancelScope(shield=True):
            async with self._lock:
                await trio.to_thread.run_sync(self._conn.close, limiter=self._threads)


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
) -> AsyncIterator[SqliteDriver]:
    """Open ``sqlite:///jobs.db``: create or upgrade the schema, switch to WAL, and close the
    connection on the way out. A new file is created readable by its owner only (0600).

    ``read_only=True`` creates, upgrades and changes nothing: a missing file is "no database
    at PATH", a file at an older schema version is refused, and every write is refused by
    SQLite itself (`ConfigError`, never a retry). ``create=False`` opens to write, but only a
    file that is already there (an operator's retry or cancel of a job that must exist).

    ``busy_timeout`` is how long a call waits for another connection's write lock before a few
    last tries and then `DriverError`. ``synchronous`` is FULL (a committed job survives a power
    cut) unless you choose NORMAL (faster; survives a crash of the process, not of the OS).
    """
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
    driver = SqliteDriver(
        conn,
        url=url,
        path=path,
        clock=clock,
        busy_timeout=busy_timeout,
        poll_interval=poll_interval,
        synchronous=synchronous.upper(),
    )
    try:
        await driver._prepare(read_only)
        yield driver
    finally:
        await driver.aclose()
