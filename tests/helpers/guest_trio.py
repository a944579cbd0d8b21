# One long-lived Trio run on a MockClock, driven step by step from synchronous code (Hypothesis
# rules), in Trio's guest mode on a host thread of its own. Own thread: a run that fails to close
# (a hang in the code under test) cannot poison the next example, whose run starts on a new one.
from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
import trio.testing

T = TypeVar("T")
SETTLE_TIMEOUT = 30.0  # real seconds: only a hang in the code under test gets near it


class GuestTrio:
    def __init__(self) -> None:
        self.clock = trio.testing.MockClock()  # rate 0, no autojump: time moves when told
        self._callbacks: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._outcome: Any = None
        self._finished = threading.Event()
        self._ready = threading.Event()
        self.nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._host = threading.Thread(target=self._host_loop, daemon=True)
        self._host.start()
        if not self._ready.wait(SETTLE_TIMEOUT):
            raise TimeoutError("the guest Trio run did not start")

    def _host_loop(self) -> None:
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=self._callbacks.put,
            done_callback=self._done,
            clock=self.clock,
            host_uses_signal_set_wakeup_fd=False,
        )
        while not self._finished.is_set():
            self._callbacks.get()()

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self._token = trio.lowlevel.current_trio_token()
            self.nursery = nursery
            self._ready.set()
            await trio.sleep_forever()

    def _done(self, outcome: Any) -> None:
        self._outcome = outcome
        self._finished.set()

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``fn(*args)`` as a task of the guest run, wait for it, then until every task is
        blocked again; answer its result (or raise its error)."""
        box: dict[str, Any] = {}
        settled = threading.Event()

        async def task() -> None:
            try:
                box["value"] = await fn(*args)
            except BaseException as exc:  # handed to the caller below
                box["error"] = exc
            await trio.testing.wait_all_tasks_blocked()
            settled.set()

        assert self._token is not None and self.nursery is not None
        nursery = self.nursery
        self._token.run_sync_soon(lambda: nursery.start_soon(task))
        if not settled.wait(SETTLE_TIMEOUT):
            raise TimeoutError("the guest Trio run did not settle (a hang in the code under test)")
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
        if not self._finished.wait(SETTLE_TIMEOUT):
            raise TimeoutError("the guest Trio run did not end when cancelled")
        self._outcome.unwrap()
