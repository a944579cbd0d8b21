# The Trio loop lends the SQLite door's thread the GIL, at a pass the thread waits for it.
# Apart from the door because it is about CPython's scheduling of threads, not SQLite's.
"""Why the loop lends the GIL (issue 44).

CPython 3.11 hands the GIL to a waiting thread only when its holder blocks, or when the waiter
has waited a whole switch interval (5 ms) with no release in between. The Trio loop lets the GIL
go at every pass (its poll for I/O), which wakes the waiter and starts its interval again, but
takes it back before the woken thread can: while the loop has work, the door's thread waits for
the GIL after each statement until the loop runs dry. Measured here: an enqueue beside ten
busy tasks took 0.7-2.0 s (1 ms with lending), and a worker's door worked only while its loop
idled, so SQLite's own work, which runs with the GIL let go, never ran beside the jobs.

While a door call is in flight, a pass of the loop that has work to run looks at the thread's
CPU clock: if it stood still since the last pass, the thread waits for the GIL (or for its
disk), and the loop lends it: it blocks on a gate that the thread opens just before its next
statement goes into SQLite (`DoorConnection`), where the thread lets the GIL go again, or once
``LEND`` has passed. A thread inside a statement is left to run: it needs no GIL there. A loop
with nothing to run waits for I/O and lends the GIL there anyway."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

import trio

# The most a pass of the loop waits for the door's thread (seconds). Measured at c=10 on SQLite
# (bench/worker_cpu.py, every pass lending): 50 µs ran 20,322-20,424 jobs/s, 200 µs
# 18,021-18,485 (a pass waits the whole of it while a statement runs).
LEND: Final = 50e-6
# A thread whose CPU clock stood still this long since the loop's last pass waits for the GIL
# (or for its disk): only then does a pass lend it (timed-out lends at c=10: 1,700 a 30,000 jobs
# without the look, 760 with). Without a thread CPU clock (macOS) every pass lends.
STILL: Final = 30e-6
# The most passes in a row that do not lend to a thread that waits for its disk.
IDLE_MOST: Final = 4
_CLOCKS: Final = hasattr(time, "pthread_getcpuclockid")


class GilHandoff(trio.abc.Instrument):
    """One door's: installed in the loop while a call of the door is in flight (`lending`)."""

    def __init__(self) -> None:
        # Locked while the thread has not asked: the loop's wait (acquire) ends when the thread
        # opens it (release), and leaves it locked again for the next.
        self._gate = threading.Lock()
        self._gate.acquire()
        self._depth = 0  # calls in flight (`lending` blocks)
        self._clock: int | None = None  # the thread's CPU clock, once it ran a statement
        self._ran = 0.0  # its CPU time, and the loop's clock, at the last pass that looked
        self._at = 0.0
        # Passes that lend nothing: a thread that did not run while lent the GIL waits for its
        # disk (a COMMIT's fsync), and each lend meanwhile would cost the loop LEND for
        # nothing. The passes skipped double at each such lend, up to IDLE_MOST.
        self._skip = 0
        self._backoff = 0

    @contextlib.contextmanager
    def lending(self) -> Iterator[None]:
        """Installed for the block (a door call: its thread, and its statements), on the Trio
        thread. Nested blocks install it once."""
        if not self._depth:
            self._clock = None  # the call's thread is not known yet
            trio.lowlevel.add_instrument(self)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                # Trio removes an instrument that raised (this one never does).
                with contextlib.suppress(KeyError):
                    trio.lowlevel.remove_instrument(self)

    def before_io_wait(self, timeout: float) -> None:
        if timeout:  # nothing to run: the loop's wait for I/O lets the GIL go anyway
            return
        clock = self._clock
        if clock is None:
            self._gate.acquire(timeout=LEND)
            return
        try:
            ran = time.clock_gettime(clock)
        except OSError:  # its thread has ended (a call abandoned at its cancel)
            self._clock = None
            return
        at = time.perf_counter()
        stood = (at - self._at) - (ran - self._ran)
        self._ran, self._at = ran, at
        if stood < STILL:
            self._backoff = 0
            return  # it ran all along: inside a statement, with no need of the GIL
        if self._skip:
            self._skip -= 1
            return
        if self._gate.acquire(timeout=LEND) or time.clock_gettime(clock) != ran:
            self._backoff = 0  # it took the GIL
        else:
            self._backoff = min(2 * self._backoff or 1, IDLE_MOST)
            self._skip = self._backoff

    def opening(self) -> None:
        """Thread side, holding the GIL, just before it lets it go (a statement, or its call's
        end): a pass of the loop waiting to lend it goes on once it has."""
        if self._clock is None and _CLOCKS:
            self._clock = time.pthread_getcpuclockid(threading.get_ident())
        # An open gate (nobody waited since the last statement) stays open: the next wait
        # then ends at once, one short lend.
        if self._gate.locked():
            # Another thread may open it between the look and the release: a caller's own
            # statements on this connection (`jobs_trio.transaction(driver)`).
            with contextlib.suppress(RuntimeError):
                self._gate.release()


class DoorConnection(sqlite3.Connection):
    """The door's connection (`sqlite3.connect(factory=)`): before each statement it opens its
    handoff's gate, so that a loop waiting to lend the GIL goes on as the statement lets it
    go. Without a handoff (a connection of the lease lifeline's) it is a plain connection."""

    handoff: GilHandoff | None = None
    # The file this connection opened: its absolute path and (device, inode) then, so that a
    # file replaced or deleted at that path since is noticed (_sqlite_door.moved_away).
    opened: tuple[str, tuple[int, int]] | None = None

    def letting_go(self) -> None:
        """The thread is about to let the GIL go for good: its call is done."""
        if self.handoff is not None:
            self.handoff.opening()

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if self.handoff is not None:
            self.handoff.opening()
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        if self.handoff is not None:
            self.handoff.opening()
        return super().executemany(sql, parameters)

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        if self.handoff is not None:
            self.handoff.opening()
        return super().executescript(sql_script)
