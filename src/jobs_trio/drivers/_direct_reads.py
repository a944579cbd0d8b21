# Who reads a connection's socket: the Trio task running an operation on a pooled one, the
# listener's own task for the LISTEN one; not the trio-asyncio loop. Apart because it reaches
# into asyncio's selector transport, and every rule of that hand-over (when the loop must read
# again, what arrived while idle) lives here alone.
"""Why: on the trio-asyncio loop, each read of a socket is a Trio task of the loop's (waiting for
readiness) that runs the transport's read, which completes asyncpg's future, whose callback goes
through the loop's queue to the loop's own task, which wakes the task that awaits it; and the
reader then waits once more for the loop to catch up. Three tasks woken per round trip, ~40 µs
of a ~110 µs ``SELECT 1`` here (bench/round_trip.py). A pooled connection is only ever used by
one operation at a time, stepped from one Trio task (asyncio_stepper), so that task can wait for
the socket itself and run the transport's read in place: the round trip wakes one task.

The loop stops reading such a connection when it is opened (``take_over``). Nothing reads it
while it is idle in the pool, so a checkout looks at its socket first (``usable``): anything
that arrived meanwhile is the server ending it, and it is dropped; and the loop reads it
again before it is closed (``let_loop_read``), for asyncpg's close waits for the server's end of the
connection. TLS connections are left to the loop (their transport is not a plain socket's).

asyncpg's own done callback on the future a reply completes (its statement timer's bookkeeping)
is run by the reading task at once (asyncio_stepper._read_now), not scheduled on the loop: run
late, after the operation's next statement had set a timer, it cancelled that timer."""

from __future__ import annotations

import asyncio
import select
from asyncio import selector_events
from typing import Any

import trio

Connection = Any  # asyncpg is untyped
# asyncio's transport of a plain socket: private, and not in typeshed.
_PLAIN: Any = selector_events._SelectorSocketTransport  # type: ignore[attr-defined]


def transport_of(conn: Connection) -> asyncio.Transport | None:
    """The plain-socket transport of an asyncpg connection whose reads we own, else None (a
    TLS connection, one the loop reads, anything that is not an asyncpg connection)."""
    transport: Any = getattr(conn, "_transport", None)
    if type(transport) is _PLAIN and transport._paused:
        return transport  # type: ignore[no-any-return]
    return None


def take_over(conn: Connection) -> None:
    """Stop the loop reading ``conn``: from now on the operation using it reads."""
    transport: Any = getattr(conn, "_transport", None)
    if type(transport) is _PLAIN and transport.is_reading():
        transport.pause_reading()


def let_loop_read(conn: Connection) -> None:
    """Let the loop read ``conn`` again (before a close, which waits for the server's end)."""
    transport = transport_of(conn)
    if transport is not None and not transport.is_closing():
        transport.resume_reading()


async def read_while_open(conn: Connection) -> None:
    """Read ``conn``'s socket from this task until it closes, instead of the loop: for the
    LISTEN connection, whose notifications (heard_at_once) then wake their waiters in this
    task's step. On the loop's path, trio-asyncio's reader task waited after each read for a
    pass of the loop's own task, which ran before the woken worker half the time: an enqueue's
    return to its job's start 1.27 -> 1.17 ms at p50 (bench/wake_path.py, 6 alternating runs
    each, median). Replies to statements run on the loop (a LISTEN ping) are read here too, and
    their futures completed as the loop would. Returns at once for a connection the loop must
    read (TLS), and hands reading back to the loop when it returns or is cancelled, for a close
    waits for the server's end of the connection."""
    take_over(conn)
    transport: Any = transport_of(conn)
    if transport is None:
        await trio.lowlevel.checkpoint()
        return
    try:
        # asyncpg resumes reading itself only around a COPY, which nothing runs on this
        # connection; if it ever did, the loop reads from then on, and so must not this task.
        while not transport.is_closing() and not transport.is_reading():
            try:
                await trio.lowlevel.wait_readable(transport._sock_fd)
            except (OSError, trio.ClosedResourceError, trio.BusyResourceError):
                # The socket was closed or taken under the wait: nothing can read it now.
                # Ended, asyncpg tells its termination listeners (the listener reconnects).
                transport.abort()
                return
            transport._read_ready()
    finally:
        let_loop_read(conn)


def usable(conn: Connection) -> bool:
    """Whether an idle ``conn`` can be handed on, now that nobody reads it while it is idle.

    An idle pooled connection is sent nothing by a working server (it LISTENs to nothing), but
    for the end of a statement cancelled outside a transaction, which asyncpg still waits for;
    otherwise anything waiting on its socket is a server ending it: a FATAL error
    (pg_terminate_backend, idle_session_timeout, a restart), then its end. It is dropped unread.
    Read instead, the error alone (its end comes later, or in the next read) leaves asyncpg's
    protocol mid-state, and the next statement fails with "cannot switch to state" on a
    connection that still looks open. The rare harmless message (a ParameterStatus after a
    reload that changed a reported setting) costs one reconnect."""
    transport = transport_of(conn)
    if transport is None:
        return True
    if transport.is_closing():
        return False
    if _cancelling(conn):
        # A statement cancelled outside a transaction ended with the crossing that ran it, and
        # nobody read its end since: what waits is that (an error, ReadyForQuery), not the
        # server ending the connection. asyncpg's next statement reads it first (it waits the
        # cancel out), as the pool has always counted on (Pool._give_back).
        return True
    # poll, not select: select() refuses a descriptor past FD_SETSIZE (1024), which a process
    # with many files open gives its sockets, and every checkout would fail with ValueError.
    # Any event counts: data (POLLIN), the server's end (POLLHUP), an error (POLLERR).
    waiting = select.poll()
    waiting.register(transport._sock_fd, select.POLLIN)  # type: ignore[attr-defined]
    return not waiting.poll(0)


def _cancelling(conn: Connection) -> bool:
    """Whether asyncpg still waits for the server's end of a cancelled statement on ``conn``."""
    protocol: Any = getattr(conn, "_protocol", None)
    cancelling = getattr(protocol, "_is_cancelling", None)
    return bool(cancelling is not None and cancelling())
