# The connections a blocking producer opens itself, kept for the next call: a few idle ones, any
# thread may take one, one thread uses it at a time. Apart so that reuse, and dropping a
# connection that failed or was left inside a transaction, is said once for SQLite and psycopg.
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .._core.forked_child import own_pid

C = TypeVar("C")


class Keeper(Generic[C]):
    """Up to ``keep`` idle connections, newest first; more are opened when more threads write
    at once, and closed when they come back to a full keeper."""

    def __init__(
        self,
        connect: Callable[[], C],
        close: Callable[[C], None],
        *,
        keep: int,
    ) -> None:
        self._connect = connect
        self._close = close
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: list[C] = []
        self._closed = False
        self._pid = own_pid()
        # What a forked child found idle here: its parent's, never used nor closed in the child
        # (held, so that no collection closes them either).
        self._inherited: list[C] = []

    def _in_this_process(self) -> None:
        """In a child forked since, leave the parent's connections alone. Written through,
        a SQLite connection wrote without the parent's file locks (not inherited by a fork), and
        the parent's close deleted the WAL it wrote to: the child's enqueues returned ids and
        were lost. A psycopg one shared the parent's session on one socket. Closed, either
        would end the parent's (a checkpoint, a Terminate)."""
        if self._pid == own_pid():
            return
        # The lock may have been held by a thread of the parent, which is not in the child.
        self._lock = threading.Lock()
        self._inherited += self._idle
        self._idle = []
        self._pid = own_pid()

    @contextlib.contextmanager
    def connection(self, *, fresh: bool = False) -> Iterator[tuple[C, bool]]:
        """A connection and whether it was used before (``fresh``: a new one). It goes back
        only when the block ended normally: one that failed may be broken or inside a
        transaction, and is closed instead."""
        self._in_this_process()
        conn: C | None = None
        if not fresh:
            with self._lock:
                if self._idle:
                    conn = self._idle.pop()
        reused = conn is not None
        if conn is None:
            conn = self._connect()
        try:
            yield conn, reused
        except BaseException:
            self._close(conn)
            raise
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(conn)
                return
        self._close(conn)

    def close(self) -> None:
        """Close the idle connections; one in use is closed when it comes back."""
        self._in_this_process()
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            self._close(conn)
