# Wake-ups for wait_for_work: one LISTEN connection per driver whose notifications (payload: a
# queue name) wake the tasks waiting on that queue, reconnected with backoff when it dies. It
# connects at open but LISTENs only once something waits for work: a process that only enqueues
# would otherwise read its own NOTIFY back on every enqueue (~25% of the call, bench/RESULTS.md).
# Apart because it is the driver's one long-lived connection and its one background task.
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import random
from collections.abc import Iterator, Sequence

import attrs
import trio

from .._core.errors import DriverError
from .._core.logs import log_event
from ._direct_reads import read_while_open
from ._postgres_bridge import CLEANUP_SECONDS, Bridge
from ._postgres_pool import Connection

# The payload that tells the watch on paused queues (Driver.wait_for_pauses) a queue was paused
# or resumed: on the channel the enqueues notify, and never a queue's name (names are printable).
PAUSES_CHANGED = "\x1epauses"

# A LISTEN connection that dies quietly (a cable, a NAT timeout) sends no termination; an idle
# ping finds it. Waiters poll on their own timeout meanwhile, so this only bounds latency.
PING_SECONDS = 30.0
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 5.0


@attrs.define(eq=False)
class _Waiter:
    queues: frozenset[str]  # empty: woken by any queue
    woken: trio.Event = attrs.Factory(trio.Event)


class Listener:
    """Owns the LISTEN connection. Notifications arrive in asyncpg callbacks on the asyncio
    side, which trio-asyncio runs inside its loop's Trio task: a notification wakes the waiters
    there and then (setting a Trio event is synchronous and never blocks); a lost connection
    is sent into a Trio channel, and :meth:`run` reconnects from Trio."""

    def __init__(self, bridge: Bridge, channel: str) -> None:
        self._bridge = bridge
        self._channel = channel
        self._waiters: set[_Waiter] = set()
        # Unbounded: the callback must never block or drop a note, and run() drains it at once.
        self._send, self._receive = trio.open_memory_channel[Connection](math.inf)  # lost ones
        self.connected = False
        self._wanted = trio.Event()  # something waits for work: LISTEN
        self._tried = trio.Event()  # the first LISTEN was acknowledged, or failed, or never will be

    async def listen(self) -> None:
        """LISTEN if nothing has yet, and return once the server has acknowledged it (or the
        first try failed: then ``connected`` stays False until a reconnect, and waiters poll).
        A waiter calls this after registering (:meth:`waiting`) and before looking for due
        work: LISTEN first, then look, then wait, so no enqueue falls between the look and the
        first notification."""
        self._wanted.set()
        await self._tried.wait()

    @contextlib.contextmanager
    def waiting(self, queues: Sequence[str]) -> Iterator[trio.Event]:
        """Register BEFORE looking for due work: a notification that lands between the look
        and the wait then still wakes the waiter instead of being missed."""
        waiter = _Waiter(frozenset(queues))
        self._waiters.add(waiter)
        try:
            yield waiter.woken
        finally:
            self._waiters.discard(waiter)

    def wake(self, queue: str | None) -> None:
        """Wake the waiters on ``queue``; everyone when None."""
        for waiter in list(self._waiters):
            if queue is None or not waiter.queues or queue in waiter.queues:
                waiter.woken.set()

    def deaf(self) -> None:
        """No LISTEN can hold (PgBouncer in transaction mode, no direct connection): waiters
        never wait for one, and poll."""
        self._tried.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The connection is made before started(): a driver whose LISTEN connection cannot be
        # made fails to open instead of starting deaf. It LISTENs once a waiter asks.
        conn: Connection | None = None
        try:
            conn = await self._bridge.connect(purpose="listen", connection_class=heard_at_once())
            task_status.started()
            await self._wanted.wait()
            try:
                await self._listen_on(conn)
            except DriverError:
                # Gone while idle (nothing watched it before LISTEN): connect again below.
                await self._bridge.close_connection(conn)
                conn = None
                self._tried.set()  # the waiter polls meanwhile
                conn = await self._reconnect()
                self.wake(None)  # and looks again now that it can be woken
            self._tried.set()
            while True:
                assert conn is not None
                await self._serve(conn)
                self.connected = False
                # Waiters on a long safety poll look again now, and poll until reconnected.
                self.wake(None)
                await self._bridge.close_connection(conn)
                conn = None
                conn = await self._reconnect()
                # Notifications sent while we were away are gone: let every waiter look again.
                self.wake(None)
        finally:
            self.connected = False
            self._tried.set()  # a waiter still asking must not wait for a listener that is gone
            self.wake(None)
            if conn is not None:
                await self._bridge.close_connection(conn)

    async def _connect(self) -> Connection:
        conn = await self._bridge.connect(purpose="listen", connection_class=heard_at_once())
        try:
            await self._listen_on(conn)
        except BaseException:
            await self._bridge.close_connection(conn)
            raise
        return conn

    async def _listen_on(self, conn: Connection) -> None:
        async def listen() -> None:
            conn.add_termination_listener(self._on_lost)
            await conn.add_listener(self._channel, self._on_notify)

        await self._bridge.call(listen, what="LISTEN")
        self.connected = True

    def _on_notify(self, conn: Connection, pid: int, channel: str, payload: str) -> None:
        # Woken here, not by run()'s task: relayed through the channel, every wake-up took one
        # more pass of Trio's scheduler (notify to waiter woken: 0.09 ms at p50, 0.003 here).
        # Called as the notification is read (heard_at_once), so it must never block or raise.
        self.wake(payload)

    def _on_lost(self, conn: Connection) -> None:
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            self._send.send_nowait(conn)

    async def _serve(self, conn: Connection) -> None:
        """Read and watch ``conn`` (its notifications wake waiters in ``_on_notify``) until it
        is lost."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_while_open, conn)
            await self._watch(conn)
            nursery.cancel_scope.cancel()

    async def _watch(self, conn: Connection) -> None:
        while True:
            with trio.move_on_after(PING_SECONDS) as idle:
                lost = await self._receive.receive()
            if idle.cancelled_caught:
                if conn.is_closed() or not await self._ping(conn):
                    return
            elif lost is conn:  # a late note from a connection already replaced is stale
                return

    async def _ping(self, conn: Connection) -> bool:
        with trio.move_on_after(CLEANUP_SECONDS):
            try:
                await self._bridge.call(lambda: conn.execute("SELECT 1"), what="LISTEN ping")
            except DriverError:
                return False
            return True
        return False

    async def _reconnect(self) -> Connection:
        for attempt in itertools.count(1):
            # Jittered: a fleet that lost its server together should not return together.
            delay = min(BACKOFF_FIRST * 2 ** (attempt - 1), BACKOFF_MAX) * random.uniform(0.5, 1)
            log_event(
                "jobs.driver.reconnect",
                logging.WARNING,
                channel=self._channel,
                attempt=attempt,
                delay=round(delay, 2),
            )
            await trio.sleep(delay)
            try:
                conn = await self._connect()
            except DriverError as exc:
                log_event(
                    "jobs.driver.reconnect-failed",
                    logging.WARNING,
                    channel=self._channel,
                    attempt=attempt,
                    error=exc.cause,
                )
                continue
            log_event("jobs.driver.reconnected", channel=self._channel, attempts=attempt)
            return conn
        raise AssertionError("unreachable")


@functools.cache
def heard_at_once() -> type:
    """The LISTEN connection's class: asyncpg's, but a notification is handed to its (sync)
    listeners as it is read (by the listener's own task: direct_reads.read_while_open), where
    asyncpg queues each call on the asyncio loop. Queued, a wake-up waited for the loop's next
    pass: an enqueue's return to its job's start took 1.33 against 1.27 ms at p50
    (bench/wake_path.py, 9 alternating runs each, median, the loop still reading). A class
    made on first use: asyncpg is imported only with the postgres extra."""
    import asyncpg

    class HeardAtOnce(asyncpg.Connection):  # type: ignore[misc]
        __slots__ = ()

        def _process_notification(self, pid: int, channel: str, payload: str) -> None:
            for listener in tuple(self._listeners.get(channel, ())):
                if listener.is_async:  # none of ours: asyncpg's own way, a task on the loop
                    self._loop.create_task(listener.cb(self._unwrap(), pid, channel, payload))
                    continue
                try:
                    listener.cb(self._unwrap(), pid, channel, payload)
                except Exception as exc:
                    # Inside asyncpg's read of the socket: an error must not reach its protocol
                    # (the loop would have logged it and gone on, so this does the same).
                    log_event(
                        "jobs.driver.notify-failed", logging.ERROR, channel=channel, error=repr(exc)
                    )

    return HeardAtOnce
