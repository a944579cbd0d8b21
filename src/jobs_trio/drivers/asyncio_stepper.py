# Runs one asyncio coroutine to its end from inside the calling Trio task, stepping it as an
# asyncio Task would. Apart because it re-states asyncio's Task rules (a cancel that misses its
# future still lands; asyncio.timeout's cancel counting) that the bridge's cleanup depends on.
# Internal: not part of the public API (docs/reference.md lists the public modules).
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
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Coroutine
from typing import Any, TypeVar

import trio

T = TypeVar("T")


async def step_to_end(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on ``loop`` (a running trio-asyncio loop of this Trio run) and answer what
    it returns or raise what it raises.

    A checkpoint's schedule point even when the coroutine ends at its first step without
    waiting (asyncpg refusing an argument before anything is sent: a lone surrogate, an int
    past int4): the pool takes a free slot without one, so this wait is the operation's only
    pass of Trio's scheduler, and a loop of refused writes must not starve the other tasks."""
    stepper = _Stepper(loop)
    try:
        return await stepper.run(coro)
    finally:
        if not stepper.waited:
            await trio.lowlevel.cancel_shielded_checkpoint()


class _Stepper:
    """One coroutine's run; it stands for the coroutine's asyncio Task while it steps."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task = trio.lowlevel.current_task()
        self._waiting: asyncio.Future[Any] | None = None  # the future the coroutine awaits
        self._must_cancel = False
        self._cancels = 0  # asyncio's count of cancel requests (cancelling / uncancel)
        self._done = False
        self._raise_cancel: Any = None  # set by a Trio cancel: raises it as Trio's
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
            self.cancel()
        # The coroutine must see its cancel through and end on its own: only then is it done.
        return trio.lowlevel.Abort.FAILED

    def _wake(self, _: object) -> None:
        trio.lowlevel.reschedule(self._task)

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
                    yielded.add_done_callback(self._wake)
                else:
                    throw = RuntimeError(
                        f"an asyncio coroutine run from Trio yielded {yielded!r}: only futures"
                        " of the driver's own loop can be awaited there"
                    )
                    continue
                self.waited = True
                await trio.lowlevel.wait_task_rescheduled(self._abort)
                waited, self._waiting = self._waiting, None
                if waited is not None:
                    try:
                        send = waited.result()
                    except BaseException as exc:  # handed to the coroutine, as a Task does
                        throw = exc
        finally:
            trio_asyncio.current_loop.reset(reset)
            coro.close()  # a no-op once it ended
