# One long-lived Trio run on a MockClock, driven step by step from synchronous code (Hypothesis
# rules), in Trio's guest mode: the host pumps Trio's callbacks until each step has settled.
from __future__ import annotations

import queue
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
import trio.testing

T = TypeVar("T")


class GuestTrio:
    def __init__(self) -> None:
        self.clock = trio.testing.MockClock()  # rate 0, no autojump: time moves when told
        self._callbacks: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._outcome: Any = None
        self.nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=self._callbacks.put,
            done_callback=self._finished,
            clock=self.clock,
            host_uses_signal_set_wakeup_fd=False,
        )
        self._pump_until(lambda: self.nursery is not None)

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._token = trio.lowlevel.current_trio_token()
            self.nursery = nursery
            await trio.sleep_forever()

    def _finished(self, outcome: Any) -> None:
        self._outcome = outcome

    def _pump_until(self, done: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    "the guest Trio run did not settle (a hang in the code under test)"
                )
            try:
                callback = self._callbacks.get(timeout=left)
            except queue.Empty:
                continue
            callback()

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` as a task of the guest run, wait for it, then until every task is
        blocked again; answer its result (or raise its error)."""
        box: dict[str, Any] = {}

        async def task() -> None:
            try:
                box["value"] = await fn(*args)
            except BaseException as exc:  # handed to the host below
                box["error"] = exc
            await trio.testing.wait_all_tasks_blocked()
            box["done"] = True

        assert self._token is not None and self.nursery is not None
        nursery = self.nursery
        self._token.run_sync_soon(lambda: nursery.start_soon(task))
        self._pump_until(lambda: "done" in box)
        if "error" in box:
            raise box["error"]
        return box.get("value")  # type: ignore[no-any-return]

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Start ``fn(*args)`` in the background, and let everything settle."""

        async def start() -> None:
            assert self.nursery is not None
            self.nursery.start_soon(fn, *args)

        self.call(start)

    def settle(self) -> None:
        self.call(trio.lowlevel.checkpoint)

    def advance(self, seconds: float) -> None:
        self.clock.jump(seconds)
        self.settle()  # a step of the run loop notices the deadlines that passed

    def close(self) -> None:
        assert self._token is not None and self.nursery is not None
        nursery = self.nursery

        def cancel_with_time_running() -> None:
            # Shielded cleanups wait on the mock clock: let it jump whenever all is blocked.
            self.clock.autojump_threshold = 0
            nursery.cancel_scope.cancel()

        self._token.run_sync_soon(cancel_with_time_running)
        self._pump_until(lambda: self._outcome is not None)
        self._outcome.unwrap()
