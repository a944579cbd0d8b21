# Runs one asyncio coroutine to its end from inside the calling Trio task, stepping it as an
# asyncio Task would. Apart because it re-states asyncio's Task rules (a cancel that misses its
# future still lands; asyncio.timeout's cancel counting) that the bridge's cleanup depends on.
"""Why not ``trio_asyncio.aio_as_trio``: that wraps the coroutine in an asyncio Task, and on the
trio-asyncio loop every step of a Task is a callback passed through the loop's queue to the
loop's own Trio task and back, several per round trip. Stepping the coroutine here costs one
pass of the loop per awaited future (its done callback): a ``SELECT 1`` then costs about what
it costs on plain asyncio (bench/round_trip.py; STACK-NOTES measured the Task path at ~3.7x).

What holds, as for a Task:
- while it steps, the coroutine sees the loop as the running loop and a current task (this
  stepper, which answers ``cancel``, ``cancelling`` and ``uncancel`` as a Task does), so
  ``asyncio.timeout``, ``asyncio.wait_for`` and asyncpg's own waits work;
- a Trio cancel cancels the coroutine ONCE, as ``Task.cancel()`` does: cleanup it then awaits
  (a rollback under ``asyncio.wait_for``) is not cancelled again; a cancel that finds the
  awaited future already done is thrown in at the next step instead;
- a coroutine that ends in CancelledError after a Trio cancel raises Trio's own Cancelled."""

from __future__ import annotations

import asyncio
import functools
import math
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import trio

T = TypeVar("T")


# How long a coroutine that reads its own socket may take to see a Trio cancel through (its
# rollback, the end of its cancelled statement) before that socket is dropped: the server may
# have stopped answering altogether, and the cleanup is shielded from every later cancel. A
# transaction's rollback in asyncpg's own hands waited for a frozen server for ever, and the
# worker around it never ended (10 minutes after SIGTERM). Past the driver's own bounds (a
# rollback's CLEANUP_SECONDS, 5 s, after the cancel's own round trip), so they act first: this
# is the floor under any cleanup they do not bound. Only where this task reads the socket
# (the pool's plain connections); a TLS one and the application's own are read by the loop.
CANCEL_THROUGH_SECONDS = 6.0


async def step_to_end(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, T],
    *,
    reads: asyncio.Transport | None = None,
    on_drop: Callable[[], None] | None = None,
) -> T:
    """Run ``coro`` on ``loop`` (a running trio-asyncio loop of this Trio run) and answer what
    it returns or raise what it raises.

    ``reads``: the transport of the one connection the coroutine uses, when the loop does not
    read it (direct_reads.transport_of): while the coroutine waits, this task waits for that
    socket and runs the transport's read itself, so a reply wakes this task alone. After a
    Trio cancel, what the coroutine then waits for on that socket is given
    CANCEL_THROUGH_SECONDS in all; past it the transport is aborted (asyncpg then fails what
    waits on the connection, and the coroutine ends), and ``on_drop`` is told.

    A checkpoint's schedule point even when the coroutine ends at its first step without
    waiting (asyncpg refusing an argument before anything is sent: a lone surrogate, an int
    past int4): the pool takes a free slot without one, so this wait is the operation's only
    pass of Trio's scheduler, and a loop of refused writes must not starve the other tasks."""
    stepper = _Stepper(loop, reads, on_drop)
    try:
        return await stepper.run(coro)
    finally:
        if not stepper.waited:
            await trio.lowlevel.cancel_shielded_checkpoint()


class _Stepper:
    """One coroutine's run; it stands for the coroutine's asyncio Task while it steps."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reads: asyncio.Transport | None,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._reads = reads
        self._on_drop = on_drop
        self._read_wait: trio.CancelScope | None = None  # a wait for the socket, while one runs
        self._task = trio.lowlevel.current_task()
        self._waiting: asyncio.Future[Any] | None = None  # the future the coroutine awaits
        self._must_cancel = False
        self._cancels = 0  # asyncio's count of cancel requests (cancelling / uncancel)
        self._done = False
        self._raise_cancel: Any = None  # set by a Trio cancel: raises it as Trio's
        self._through_by = math.inf  # when a cancel's cleanup must be over (direct reads)
        self._dropped = False  # its transport aborted for a cleanup past _through_by
        self.waited = False  # whether the coroutine ever waited (a pass of the scheduler)

    # --- what asyncio asks of a current task ---

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def done(self) -> bool:
        return self._done

    def cancelling(self) -> int:
        return self._cancels

    def uncancel(self) -> int:
        if self._cancels > 0:
            self._cancels -= 1
        return self._cancels

    def cancel(self, msg: object = None) -> bool:
        if self._done:
            return False
        self._cancels += 1
        # The awaited future is cancelled now; one already done cannot be, and the coroutine
        # gets its CancelledError at the next step instead (asyncio's _must_cancel).
        if self._waiting is None or not self._waiting.cancel(msg):
            self._must_cancel = True
        return True

    # --- the run ---

    def _abort(self, raise_cancel: Any) -> trio.lowlevel.Abort:
        if self._raise_cancel is None:
            self._raise_cancel = raise_cancel
            self._through_by = trio.current_time() + CANCEL_THROUGH_SECONDS
            self.cancel()
        # The coroutine must see its cancel through and end on its own: only then is it done.
        return trio.lowlevel.Abort.FAILED

    def _wake(self, _: object) -> None:
        trio.lowlevel.reschedule(self._task)

    def _end_read_wait(self, _: object) -> None:
        # The awaited future was completed by the loop (a timer, asyncio.timeout's cancel, a
        # write that drained, the connection lost): no reply is coming to wake the read wait.
        if self._read_wait is not None:
            self._read_wait.cancel()

    async def _read_until(self, waiting: asyncio.Future[Any]) -> None:
        """Wait for ``waiting`` by reading the connection's socket from this task, as the loop
        would have read it, until the future is done."""
        transport = self._reads
        assert transport is not None
        while not waiting.done():
            if transport.is_closing() or transport.is_reading():
                # Closing (the loop ends it and completes the future), or read by the loop again
                # (asyncpg resumed reading): the loop's path, or two tasks would wait on one fd.
                waiting.add_done_callback(self._wake)
                await trio.lowlevel.wait_task_rescheduled(self._abort)
                return
            waiting.add_done_callback(self._end_read_wait)
            # After a Trio cancel the coroutine is seeing its cancel through (a rollback, the
            # server's cancel): that is not cancelled again, as _abort does on the loop's path.
            self._read_wait = scope = trio.CancelScope(shield=self._raise_cancel is not None)
            if scope.shield:
                scope.deadline = self._through_by
            cancelled = False
            try:
                with scope:
                    await trio.lowlevel.wait_readable(transport._sock_fd)  # type: ignore[attr-defined]
            except (trio.Cancelled, KeyboardInterrupt) as exc:
                # Only the first cancels the coroutine (as _abort does on the loop's path); a
                # later one (KeyboardInterrupt reaches a shielded wait) leaves it reading on.
                cancelled = self._raise_cancel is None
                self._abort(functools.partial(_reraise, exc))
            except (OSError, trio.ClosedResourceError, trio.BusyResourceError):
                # The wait itself failed: the socket was closed or taken under it. Nothing can
                # read this connection now; ended, asyncpg fails what waits on it (a lost
                # connection), and the loop's path above sees that through.
                transport.abort()
            finally:
                self._read_wait = None
                waiting.remove_done_callback(self._end_read_wait)
            if cancelled:
                # _abort cancelled the awaited future, whose own done callbacks run on the loop:
                # asyncpg's asks the server to cancel and marks the statement as being cancelled.
                # A Task resumes only after them, and so must the coroutine here: resumed first,
                # its next statement (the rollback; the next operation on this connection, run
                # at once) finds the protocol still mid-statement, "another operation is in
                # progress", instead of waiting the cancel out.
                waiting.add_done_callback(self._wake)
                await trio.lowlevel.wait_task_rescheduled(self._abort)
                return
            if not scope.cancelled_caught:
                self._read_now(transport, waiting)
            elif scope.shield and not waiting.done() and trio.current_time() >= self._through_by:
                # The server answered nothing of the cancel's cleanup in time: dropped. The
                # loop ends the transport and fails the awaited future (the path above).
                self._dropped = True
                transport.abort()
                if self._on_drop is not None:
                    self._on_drop()

    def _read_now(self, transport: asyncio.Transport, waiting: asyncio.Future[Any]) -> None:
        """Run the transport's read, which may complete ``waiting``. asyncpg's own done callback
        on its waiter (its bookkeeping: the statement's timer) is run here, before the coroutine
        resumes, rather than scheduled on the loop: a pass of the loop's task less per round trip
        (~10% of an enqueue's CPU), and the callback can no longer land after the next statement
        has set its own timer, and cancel that."""
        protocol_done: Any = getattr(transport.get_protocol(), "_on_waiter_completed", None)
        held_back = protocol_done is not None and waiting.remove_done_callback(protocol_done)
        try:
            transport._read_ready()  # type: ignore[attr-defined]
        finally:
            if held_back:
                if waiting.done():
                    protocol_done(waiting)
                else:
                    waiting.add_done_callback(protocol_done)

    def _step(self, coro: Coroutine[Any, Any, T], send: Any, throw: BaseException | None) -> Any:
        if self._must_cancel:
            self._must_cancel = False
            throw = asyncio.CancelledError()
        # asyncio takes any object as the current task; its stubs say Task.
        _enter_task(self._loop, self)  # type: ignore[arg-type]
        try:
            return coro.throw(throw) if throw is not None else coro.send(send)
        finally:
            _leave_task(self._loop, self)  # type: ignore[arg-type]

    def _outcome(self) -> tuple[Any, BaseException | None]:
        """What the awaited future gives the coroutine's next step, as a Task hands it on."""
        waited, self._waiting = self._waiting, None
        if waited is None:
            return None, None
        try:
            return waited.result(), None
        except BaseException as exc:
            return None, exc

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        import trio_asyncio

        send: Any = None
        throw: BaseException | None = None
        # The loop must be the running loop while the coroutine steps; trio-asyncio reads it
        # from this Trio task's context, where a task started before the loop opened has none.
        reset = trio_asyncio.current_loop.set(self._loop)
        try:
            while True:
                try:
                    yielded = self._step(coro, send, throw)
                except StopIteration as stop:
                    self._done = True
                    return stop.value  # type: ignore[no-any-return]
                except asyncio.CancelledError:
                    self._done = True
                    if self._raise_cancel is not None:
                        self._raise_cancel()  # Trio's Cancelled (or KeyboardInterrupt)
                    raise
                except BaseException:
                    self._done = True
                    if self._dropped and self._raise_cancel is not None:
                        # The cleanup failed because we dropped its connection: the caller's
                        # cancel is what happened, not a lost connection.
                        self._raise_cancel()
                    raise
                send = throw = None
                if yielded is None:
                    # A bare yield (asyncio.sleep(0)): one pass of the loop, then on.
                    self._loop.call_soon(self._wake, None)
                elif getattr(yielded, "_asyncio_future_blocking", None) and (
                    yielded.get_loop() is self._loop
                ):
                    yielded._asyncio_future_blocking = False
                    self._waiting = yielded
                    if self._reads is not None:
                        self.waited = True
                        await self._read_until(yielded)
                        send, throw = self._outcome()
                        continue
                    yielded.add_done_callback(self._wake)
                else:
                    throw = RuntimeError(
                        f"an asyncio coroutine run from Trio yielded {yielded!r}: only futures"
                        " of the driver's own loop can be awaited there"
                    )
                    continue
                self.waited = True
                await trio.lowlevel.wait_task_rescheduled(self._abort)
                send, throw = self._outcome()
        finally:
            trio_asyncio.current_loop.reset(reset)
            coro.close()  # a no-op once it ended


def _reraise(exc: BaseException) -> None:
    raise exc
