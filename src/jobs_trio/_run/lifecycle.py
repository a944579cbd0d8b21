# The process's shutdown: SIGTERM/SIGINT, then every registered hook's `accept`, then `aclose`
# under one grace budget. Apart because workers, HTTP servers and drivers all end through it.
from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import FrameType
from typing import Protocol

import trio

from .._core.ending import end_process
from .._core.errors import ConfigError
from .._core.logs import log_event
from .._core.single_error import unwrap_single_error
from .budget import WRITE_FLOOR, Budget
from .early_signals import EarlySignals

ABANDONED_EXIT_CODE = 70  # EX_SOFTWARE: work that ignored its cancellation was left behind
# Hooks bound their own waits by the budget; the lifecycle waits for their answers a little
# longer, so a hook that reached its deadline can still say what it abandoned.
CLOSE_MARGIN = 1.0


class Hook(Protocol):
    """What a part of the application gives the lifecycle. ``accept`` must not block: it
    stops intake and tells running work to stop. ``bind`` bounds the coming waits. ``aclose``
    waits out the part's work within that bound."""

    def accept(self, reason: str) -> None: ...

    def bind(self, deadline: float) -> None: ...

    async def aclose(self) -> Sequence[str]:
        """Answers what was abandoned at the budget (job ids), if anything."""
        ...


def _exit_abandoned(jobs: Sequence[str]) -> None:
    end_process(ABANDONED_EXIT_CODE)


def bound_exit(deadline: float, signal_name: str) -> None:
    """Make sure this process ends by ``deadline`` (``time.monotonic``) once its main code has:
    a thread that is not a daemon and never ends — left behind by a job body, a library's pool
    — kept a drained worker alive for ever after ``jobs.lifecycle.closed``, deaf to every
    further signal (issue 32). A daemon thread waits for the main thread to finish; the threads
    still alive then get until ``deadline`` to end, and if any is left the process exits with
    ``ABANDONED_EXIT_CODE``, naming them. It waits on joins, never polls, and does nothing in
    a process whose threads all end."""

    def guard() -> None:
        # Returns once the interpreter is shutting down: threading._shutdown stops the main
        # thread, then waits for every non-daemon thread (this one is a daemon).
        threading.main_thread().join()
        for thread in _lingering():
            thread.join(max(deadline - time.monotonic(), 0))
        left = _lingering()
        if not left:
            return
        log_event(
            "jobs.lifecycle.exit-forced",
            logging.ERROR,
            signal=signal_name,
            threads=[thread.name for thread in left],
            why="the program had ended, but these threads (not daemons) were still running at"
            " the end of the grace period and would have kept the process alive",
            fix="end them when the job ends, or start them with daemon=True",
        )
        _exit_abandoned([])

    threading.Thread(target=guard, name="jobs_trio-exit-guard", daemon=True).start()


def _lingering() -> list[threading.Thread]:
    main = threading.main_thread()
    return [t for t in threading.enumerate() if not t.daemon and t is not main and t.is_alive()]


class Lifecycle:
    def __init__(
        self,
        grace: float,
        *,
        on_abandoned: Callable[[Sequence[str]], None] = _exit_abandoned,
        guard_exit: bool = True,
    ) -> None:
        if not grace >= 0:
            raise ConfigError(f"grace={grace!r}", fix="give grace >= 0 seconds")
        self.grace = grace
        self._hooks: list[Hook] = []
        self._budget = Budget()
        self._close_budget = Budget()
        self._in_flight = 0
        self._idle = trio.lowlevel.ParkingLot()
        self._on_abandoned = on_abandoned
        self._shutdown_started = False
        self.closed = trio.Event()
        self._body_scope = trio.CancelScope()
        self.reason: str | None = None
        # The hooks this shutdown told to accept, and closes: a worker unregisters itself when
        # its teardown ends, which may be before the aclose phase that asks what it abandoned.
        self._told: list[Hook] = []
        self._guard_exit = guard_exit
        self._exit_guarded = False
        # When each signal arrived (time.monotonic), written by the signal handler itself: it
        # runs in the main thread between bytecodes even while a job body blocks the loop (a
        # time.sleep in an async body), when the Trio task that shuts down cannot run. The
        # drain's budget counts from here, and the lease lifeline ends a process whose loop
        # is still blocked when it is spent (end_by).
        self._heard: list[float] = []

    def register(self, hook: Hook) -> None:
        if hook not in self._hooks:
            self._hooks.append(hook)
        if self._shutdown_started:
            # Registered during a shutdown (a worker starting late): it stops at once too.
            if hook not in self._told:
                self._told.append(hook)
            hook.accept(self.reason or "shutdown")
            hook.bind(self._budget.deadline)

    def unregister(self, hook: Hook) -> None:
        if hook in self._hooks:
            self._hooks.remove(hook)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count a piece of in-flight work (a request, say): the shutdown waits for it,
        within the budget, before it closes the hooks."""
        done = self.counted()
        try:
            yield
        finally:
            done()

    def counted(self) -> Callable[[], None]:
        """``track`` for work whose end is a call, not a block: counted until the answered
        function is called (once; later calls do nothing)."""
        self.work_began()
        ended = False

        def done() -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            self.work_ended()

        return done

    def work_began(self) -> None:
        """One more piece of work the close waits for, until ``work_ended`` (called once for
        it): the worker's runs, counted until their settlement is written, which the settler
        tells, not the run's task; a call each, no closure made per run (issue 44)."""
        self._in_flight += 1

    def work_ended(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.unpark_all()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def deadline(self) -> float:
        return self._budget.deadline

    def end_by(self) -> float | None:
        """When (``time.monotonic``) a signalled process must have ended: the grace period
        after the first signal, or at once after a second. None before any signal. Read from
        the lease lifeline's thread."""
        heard = list(self._heard)
        if not heard:
            return None
        return heard[1] if len(heard) > 1 else heard[0] + self.grace

    def _grace_left(self) -> float:
        """The grace period less the time since the first signal arrived: a loop blocked by a
        body heard the signal late, and the budget was the whole grace again from there."""
        if not self._heard:
            return self.grace
        return max(self.grace - (time.monotonic() - self._heard[0]), 0.0)

    @property
    def shut_down(self) -> bool:
        """Whether a shutdown has begun (a signal, or ``shutdown()`` called)."""
        return self._shutdown_started

    def bind(self, deadline: float) -> None:
        """Bound every wait of the shutdown by ``deadline``, every hook's too (only ever
        tightens): the same act as ``Hook.bind``, for the whole process."""
        self._budget.bind(deadline)
        # The hooks' decided writes may run to their floor past a cut (Budget.writes): the
        # close waits for them, or a second signal would end the process before the hand-backs
        # it promised to write, and with nothing abandoned reported.
        self._close_budget.bind(max(deadline, trio.current_time() + WRITE_FLOOR) + CLOSE_MARGIN)
        for hook in list(self._hooks) + [h for h in self._told if h not in self._hooks]:
            hook.bind(deadline)

    async def shutdown(self, reason: str = "shutdown") -> None:
        """Run the shutdown: ``accept`` on every hook, wait in-flight work, then ``aclose`` every
        hook concurrently, all bounded by ``grace``; then end the ``open_lifecycle`` block.
        A second call (a second signal) cuts the remaining budget to zero."""
        if self._shutdown_started:
            log_event(
                "jobs.lifecycle.budget-cut",
                logging.WARNING,
                reason=reason,
                first=self.reason,
                cut="the wait for running bodies: a body still running now is abandoned (its"
                " lease lapses; it runs again elsewhere)",
                kept=f"the writes of endings already decided (hand-backs, results): up to"
                f" {WRITE_FLOOR:g} s more",
            )
            self.bind(trio.current_time())
            await self.closed.wait()
            return
        self._shutdown_started = True
        self.reason = reason
        log_event(
            "jobs.lifecycle.shutdown", reason=reason, grace=self.grace, hooks=len(self._hooks)
        )
        deadline = trio.current_time() + self._grace_left()
        self._told = list(self._hooks)
        # accept BEFORE any wait: a running job must hear the drain while the whole budget is
        # still there for it to unwind in.
        for hook in list(self._told):
            hook.accept(reason)
        self.bind(deadline)
        with self._budget.scope:
            while self._in_flight > 0:
                await self._idle.park()
        abandoned: list[str] = []

        async def aclose(hook: Hook) -> None:
            abandoned.extend(await hook.aclose() or ())

        with self._close_budget.scope:
            async with trio.open_nursery() as nursery:
                for hook in list(self._told):
                    nursery.start_soon(aclose, hook)
        if abandoned:
            log_event("jobs.lifecycle.abandoned", logging.ERROR, jobs=abandoned)
            self._on_abandoned(abandoned)
        log_event("jobs.lifecycle.closed", reason=reason)
        self.closed.set()
        self._body_scope.cancel()

    async def _listen(
        self,
        signals: Sequence[int],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with trio.open_signal_receiver(*signals) as received, _heard_at(signals, self._heard):
            task_status.started()
            async with trio.open_nursery() as nursery:
                async for signum in received:
                    name = signal.Signals(signum).name
                    self.signalled(name)
                    nursery.start_soon(self.shutdown, name)

    def signalled(self, name: str) -> None:
        """A signal asks this process to end: from the first, its end is bounded by the grace
        period whatever the code after the lifecycle does (see ``bound_exit``)."""
        if not self._exit_guarded and self._guard_exit:
            self._exit_guarded = True
            bound_exit(time.monotonic() + self._grace_left(), name)  # from its arrival


@contextlib.contextmanager
def _heard_at(signals: Sequence[int], heard: list[float]) -> Iterator[None]:
    """Note when each of ``signals`` arrives (in ``heard``), then hand it to the handler that
    was there (Trio's receiver's), which it is again at the end."""
    before = {number: signal.getsignal(number) for number in signals}

    def hear(number: int, frame: FrameType | None) -> None:
        heard.append(time.monotonic())
        handler = before[number]
        if callable(handler):
            handler(number, frame)

    for number in signals:
        signal.signal(number, hear)
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


@contextlib.asynccontextmanager
async def open_lifecycle(
    grace: float = 25.0,
    *,
    signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
    on_abandoned: Callable[[Sequence[str]], None] = _exit_abandoned,
    early: EarlySignals | None = None,
    guard_exit: bool = True,
) -> AsyncIterator[Lifecycle]:
    """Listen for ``signals``; on the first, shut down (see ``Lifecycle.shutdown``) and end
    this block; a second cuts the budget to zero. The block also ends, unshut, if its body
    returns first. ``early``: signals held before this listened (the console script's), acted
    on as if they arrived now. ``guard_exit`` (on by default): once signalled, the process ends
    within ``grace`` even if a thread left behind would keep it alive (see ``bound_exit``)."""
    lifecycle = Lifecycle(grace, on_abandoned=on_abandoned, guard_exit=guard_exit)
    with unwrap_single_error():
        async with trio.open_nursery() as nursery:
            if signals:
                await nursery.start(lifecycle._listen, tuple(signals))
            # After the receiver is in place, so a signal is either recorded before (and
            # read here) or heard by it: none falls between the two.
            if early is not None:
                lifecycle._heard[:0] = early.arrived  # their grace counts from their arrival
            for name in early.received if early is not None else ():
                lifecycle.signalled(name)
                nursery.start_soon(lifecycle.shutdown, name)
            with lifecycle._body_scope:
                yield lifecycle
            nursery.cancel_scope.cancel()


async def open_own_lifecycle(
    stack: contextlib.AsyncExitStack, *, what: str, name: str, grace: float
) -> Lifecycle | None:
    """The lifecycle a worker or relay opens for itself when the application passed none:
    draining is on by default, so SIGTERM and SIGINT stop it gracefully and then end its block.
    None outside the main thread, where no signal can reach a Trio run (said in a log line)."""
    if threading.current_thread() is not threading.main_thread():
        fields: dict[str, object] = {what: name}
        log_event(
            f"jobs.{what}.no-drain",
            logging.INFO,
            **fields,
            why="not in the main thread, so no signal can reach it",
            fix="pass lifecycle= from the main thread's open_lifecycle(), or "
            "drain_on_shutdown=False to silence this",
        )
        return None
    opened: dict[str, object] = {what: name, "grace": grace}
    log_event(f"jobs.{what}.lifecycle-opened", logging.INFO, **opened)
    return await stack.enter_async_context(open_lifecycle(grace=grace))
