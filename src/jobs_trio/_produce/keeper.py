# The connections a blocking producer opens itself, kept for the next call: a few idle ones, any
# thread may take one, one thread uses it at a time. Apart so that reuse, and dropping a
# connection that failed or was left inside a transaction, is said once for SQLite and psycopg.
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

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

    @contextlib.contextmanager
    def connection(self, *, fresh: bool = False) -> Iterator[tuple[C, bool]]:
        """A connection and whether it was used before (``fresh``: a new one). It goes back
        only when the block ended normally: one that failed may be broken or inside a
        transaction, and is closed instead."""
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
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            self._close(conn)
