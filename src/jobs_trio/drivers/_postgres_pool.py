# The PostgreSQL driver's connection pool, kept on the Trio side: a checkout is a Trio semaphore
# and a list, not an asyncio round trip; and the session settings its connections open with.
# Apart because asyncpg's own pool costs two extra asyncio hops per operation through
# trio-asyncio (measured: ~0.3 ms of a ~0.4 ms operation).
from __future__ import annotations

import contextlib
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trio

from .._core.errors import ConfigError
from ._direct_reads import usable

Connection = Any  # asyncpg is untyped

# Every statement of a pooled connection has bounded waits (issue 9): a row lock held elsewhere
# (an operator's open transaction, a stuck session) fails the statement after the lock timeout
# instead of hanging it, so a renewal that meets one fails well inside the lease (8 s, renewed
# every 2.7 s) and the worker's own clock decides what happens to the run. The statement timeout
# bounds everything else; the longest statement of a working fleet is an enqueue of 100,000
# jobs (~2 s). Both in seconds; 0 turns a bound off. Migrations lift both for their transaction.
DEFAULT_STATEMENT_TIMEOUT = 30.0
DEFAULT_LOCK_TIMEOUT = 2.0
# A transaction of the driver's own left idle this long is ended by the server. The driver's
# transactions send their statements back to back (ms apart); one that idles is in a process
# that stopped (SIGSTOP, a VM paused) or whose loop a body blocks, and the row locks it holds
# (the cron mark of a tick, every limit row of a key a claim looks at) stalled the whole
# fleet's cron and failed other workers' renewals, every run of theirs, for as long as it
# stayed stopped (a review, 2026-12-07). Below the lock timeout, so that a statement queued
# behind such a transaction gets through instead of failing. A transaction that may idle for
# reasons of its own lifts it with LIFT_IDLE_BOUND: the application's (jobs_trio.transaction),
# the one-database relay's pass (its jobs made in Python mid-transaction), and migrations
# (postgres/_schema.sql, migration_waits).
DEFAULT_IDLE_IN_TRANSACTION = 1.0
LIFT_IDLE_BOUND = "SET LOCAL idle_in_transaction_session_timeout = 0"
_DEFAULTS = {
    "statement_timeout": DEFAULT_STATEMENT_TIMEOUT,
    "lock_timeout": DEFAULT_LOCK_TIMEOUT,
    "idle_in_transaction_session_timeout": DEFAULT_IDLE_IN_TRANSACTION,
}
# PostgreSQL keeps these as whole milliseconds in a 32-bit integer.
_MAX_SECONDS = (2**31 - 1) / 1000

# The rest of the session. Generic plans spare the ~1 ms of planning a claim costs each time,
# and every hot-path statement is shaped so that its generic plan reads by index (see
# postgres/_jobs.sql; tests/drivers/test_postgres_plans.py checks it). Sorts off: a claim must
# walk
# its claim-order index even when the statistics do not yet know a queue is deep (a batch just
# enqueued) and a sort of every waiting row looks as cheap. JIT only ever costs on statements
# this short (the disable cost alone trips it: 0.8 s a claim). Sequential scans off: a
# connection keeps the generic plan it made at a statement's first execution, and one made
# while the table was empty (a fresh deploy) read the whole table in every claim and settle,
# slower with each finished job until an autovacuum's ANALYZE replaced it (migration 0008 took
# away the other whole-table read such a plan found; tests/drivers/test_postgres_plans.py; the
# operator's full-table statistics turn it back on for themselves). As session settings they
# cost no round trip.
PLANNER_SETTINGS = {
    "enable_sort": "off",
    "enable_seqscan": "off",
    "jit": "off",
    "plan_cache_mode": "force_generic_plan",
}

# PostgreSQL's own spelling of a duration, as a URL query gives it: milliseconds unless a unit.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s|min|h|d)?\s*$")
_UNIT_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def session_settings(
    url: str, *, statement_timeout: float | None = None, lock_timeout: float | None = None
) -> dict[str, str]:
    """The server settings a pooled connection opens with. Each timeout is the argument if
    given, else the URL's query (``?statement_timeout=10s&lock_timeout=500ms``, PostgreSQL's
    units, milliseconds by default; ``idle_in_transaction_session_timeout`` from the URL only),
    else the default."""
    from_url = parse_qs(urlsplit(url).query)
    chosen: dict[str, float | None] = {
        "statement_timeout": statement_timeout,
        "lock_timeout": lock_timeout,
    }
    settings = dict(PLANNER_SETTINGS)
    for key, default in _DEFAULTS.items():
        value = chosen.get(key)
        if value is not None:
            seconds = _checked_seconds(key, value, f"{key}={value!r}")
        elif key in from_url:
            text = from_url[key][-1]
            seconds = _checked_seconds(key, _url_duration(key, text), f"{key}={text!r}")
        else:
            seconds = default
        # Whole milliseconds, at least 1 unless off: PostgreSQL rounds a smaller value to 0,
        # which would turn the bound off.
        settings[key] = "0" if seconds == 0 else f"{max(1, round(seconds * 1000))}ms"
    return settings


def _checked_seconds(key: str, value: object, given: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= _MAX_SECONDS
    ):
        raise ConfigError(
            f"{given} is not a number of seconds PostgreSQL can take",
            fix=f"pass {key} in seconds, from 0 (no bound) to {_MAX_SECONDS:,.0f}; the default "
            f"is {_DEFAULTS[key]}",
        )
    return float(value)


def _url_duration(key: str, text: str) -> float:
    matched = _DURATION.match(text)
    if not matched:
        raise ConfigError(
            f"{key}={text!r} in the database URL is not a duration",
            fix=f"write it as PostgreSQL does: ?{key}=500ms, ?{key}=10s (a bare number is "
            "milliseconds; 0 turns the bound off)",
        )
    return float(matched.group(1)) * _UNIT_SECONDS[matched.group(2) or "ms"]


class Pool:
    """Up to ``size`` connections, opened on demand by ``connect`` and reused newest first (its
    prepared statements are warm). A connection that comes back closed (killed by the server,
    broken mid-operation), still inside a transaction, or from an operation a cancel cut short
    is dropped, never handed on: the next checkout opens a fresh one. That is how the pool
    replaces dead connections."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Connection]],
        size: int,
        retire: Callable[[Connection], Awaitable[None]] | None = None,
    ) -> None:
        self._connect = connect
        # How a connection whose operation a cancel cut short is let go (bounded, run
        # shielded): the bridge lets asyncpg's cancel of the query reach the server first.
        self._retire = retire
        self._slots = trio.Semaphore(size)
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._closed = False

    @contextlib.asynccontextmanager
    async def checkout(self) -> AsyncIterator[Connection]:
        if self._closed:
            raise ConfigError(
                "the PostgreSQL driver's connections are closed", fix="open a new driver"
            )
        # A free slot is taken without a pass of Trio's scheduler (Semaphore's acquire always
        # yields once): every driver operation goes through here, and the operation's own
        # wait for the server is its checkpoint. A cancelled caller still stops here.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
            # Handed a slot, then cancelled before running: give it back unused rather than
            # send a statement only to cancel it on the server.
            try:
                await trio.lowlevel.checkpoint_if_cancelled()
            except BaseException:
                self._slots.release()
                raise
        try:
            conn = self._take_idle()
            if conn is None:
                conn = await self._connect()
                self._open.add(conn)
            # A cancel (or any BaseException) that lands while an operation is on the
            # connection may leave asyncpg's protocol mid-operation: handed on, the next
            # operation failed "cannot switch to state 12; another operation (2) is in
            # progress" (issue 32, pg_terminate_backend chaos). Such a connection is closed;
            # one that answered, an error included, goes back.
            answered = False
            try:
                yield conn
                answered = True
            except Exception:
                answered = True
                raise
            finally:
                if answered:
                    self._give_back(conn)
                else:
                    self._open.discard(conn)
                    if self._retire is not None:
                        with trio.CancelScope(shield=True):
                            await self._retire(conn)
                    conn.terminate()
        finally:
            self._slots.release()

    def _take_idle(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if usable(conn) and not conn.is_closed():
                return conn
            self._drop(conn)  # ended by the server while idle
        return None

    def _give_back(self, conn: Connection) -> None:
        if self._closed or conn.is_closed() or conn.is_in_transaction():
            self._drop(conn)
            return
        self._idle.append(conn)

    def _drop(self, conn: Connection) -> None:
        self._open.discard(conn)
        conn.terminate()

    def take_all(self) -> tuple[list[Connection], list[Connection]]:
        """Close the pool: no more checkouts; answer every connection still open, idle ones
        first, then ones an operation still holds, for the caller to close or terminate."""
        self._closed = True
        idle = list(self._idle)
        held = [conn for conn in self._open if conn not in idle]
        self._idle.clear()
        self._open.clear()
        return idle, held
