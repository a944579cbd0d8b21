# The asyncio stepper: an asyncio coroutine run to its end from a Trio task keeps asyncio's Task
# rules (one cancel, a cancel that misses its future, asyncio.timeout) without a database.
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing
import trio_asyncio

from jobs_trio.drivers._asyncio_stepper import step_to_end
from tests.helpers.turn_counter import TurnCounter


@pytest.fixture
async def loop() -> AsyncIterator[Any]:
    async with trio_asyncio.open_loop() as loop:
        yield loop


async def test_it_answers_what_the_coroutine_returns_or_raises(loop: Any) -> None:
    async def answer() -> int:
        await asyncio.sleep(0)  # a bare yield: one pass of the loop
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, 41)
        return await fut + 1

    async def fail() -> None:
        await asyncio.sleep(0)
        raise LookupError("from asyncio")

    assert await step_to_end(loop, answer()) == 42
    with pytest.raises(LookupError, match="from asyncio"):
        await step_to_end(loop, fail())


async def test_the_coroutine_sees_its_loop_and_a_current_task(loop: Any) -> None:
    seen: list[object] = []

    async def look() -> None:
        seen.append(asyncio.get_running_loop())
        seen.append(asyncio.current_task())
        await asyncio.sleep(0)
        seen.append(asyncio.current_task())

    # A task started where no loop is current (a worker's tasks start before the driver opens
    # its loop): the stepper makes the loop current itself.
    async with trio.open_nursery() as nursery:

        async def elsewhere() -> None:
            trio_asyncio.current_loop.set(None)
            await step_to_end(loop, look())

        nursery.start_soon(elsewhere)
    assert seen[0] is loop
    assert seen[1] is not None and seen[1] is seen[2]
    # Between steps the task is not current: the loop's own tasks may run meanwhile.
    assert asyncio.tasks._current_tasks.get(loop) is None  # type: ignore[attr-defined]


async def test_asyncio_timeout_works_inside(loop: Any) -> None:
    async def times_out() -> str:
        never = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(0):  # expires on the loop's next pass
                await never
        except TimeoutError:
            return "timed out"
        return "not"

    assert await step_to_end(loop, times_out()) == "timed out"


async def test_a_trio_cancel_cancels_the_awaited_future_once_and_cleanup_runs(loop: Any) -> None:
    waiting = trio.Event()
    in_cleanup = trio.Event()
    seen: list[str] = []
    aio_loop: asyncio.AbstractEventLoop = loop
    first = aio_loop.create_future()
    cleanup = aio_loop.create_future()

    async def body() -> None:
        try:
            waiting.set()
            await first
        except asyncio.CancelledError:
            seen.append("cancelled")
            in_cleanup.set()
            # Cleanup awaited after the cancel (a rollback) is not cancelled again, even
            # though the Trio scope stays cancelled while it runs.
            seen.append(await cleanup)
            raise

    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:

        async def cancel_then_finish_cleanup() -> None:
            await waiting.wait()
            scope.cancel()
            await in_cleanup.wait()
            await trio.testing.wait_all_tasks_blocked()  # the cleanup waits, cancel pending
            cleanup.set_result("cleaned up")

        nursery.start_soon(cancel_then_finish_cleanup)
        with scope:
            await step_to_end(loop, body())
    assert scope.cancelled_caught  # Trio's Cancelled, not asyncio's CancelledError
    assert first.cancelled()
    assert seen == ["cancelled", "cleaned up"]


async def test_a_timeout_in_cleanup_after_a_trio_cancel_times_out_as_its_own(loop: Any) -> None:
    # asyncio.timeout counts the cancels already requested when it starts (cancelling()):
    # its own expiry in cleanup is a TimeoutError there, not the Trio cancel coming back.
    seen: list[str] = []

    async def body() -> None:
        aio = asyncio.get_running_loop()
        try:
            await aio.create_future()
        except asyncio.CancelledError:
            try:
                async with asyncio.timeout(0):
                    await aio.create_future()
            except TimeoutError:
                seen.append("cleanup timed out")
            raise

    with trio.CancelScope() as scope:
        scope.cancel()
        await step_to_end(loop, body())
    assert scope.cancelled_caught
    assert seen == ["cleanup timed out"]


async def test_a_trio_cancel_beside_an_expiring_timeout_ends_as_trios_cancel(loop: Any) -> None:
    # Each cancel is counted (cancel / uncancel): a timeout that expires with Trio's cancel
    # also requested lets the CancelledError through, as it would for a Task.
    scope = trio.CancelScope()

    async def body() -> None:
        aio = asyncio.get_running_loop()
        async with asyncio.timeout(None) as timeout:

            def expire_then_cancel() -> None:
                timeout.reschedule(aio.time())  # its cancel queued now
                aio.call_soon(scope.cancel)  # Trio's right after, before the next step

            aio.call_soon(expire_then_cancel)
            await aio.create_future()

    with scope:
        await step_to_end(loop, body())
    assert scope.cancelled_caught


async def test_a_cancel_that_misses_its_future_lands_at_the_next_step(loop: Any) -> None:
    waiting = trio.Event()
    aio_loop: asyncio.AbstractEventLoop = loop
    fut = aio_loop.create_future()
    seen: list[str] = []

    async def body() -> str:
        waiting.set()
        try:
            await fut
        except asyncio.CancelledError:
            seen.append("cancelled though the future had a result")
            raise
        return "ran on"

    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:

        async def answer_then_cancel() -> None:
            await waiting.wait()
            # The result is in, its callback not yet run: the cancel cannot cancel the
            # future, so (as asyncio's Task does) the coroutine gets it at the next step.
            fut.set_result(None)
            scope.cancel()

        nursery.start_soon(answer_then_cancel)
        with scope:
            await step_to_end(loop, body())
    assert scope.cancelled_caught
    assert seen == ["cancelled though the future had a result"]


async def test_a_coroutine_that_swallows_the_cancel_returns_its_answer(loop: Any) -> None:
    aio_loop: asyncio.AbstractEventLoop = loop
    fut = aio_loop.create_future()
    answers: list[str] = []

    async def body() -> str:
        try:
            await fut
        except asyncio.CancelledError:
            return "swallowed"
        return "not cancelled"

    with trio.CancelScope() as scope:
        scope.cancel()
        answers.append(await step_to_end(loop, body()))
        await trio.lowlevel.checkpoint()  # Trio's own cancel still lands at its next checkpoint
    assert answers == ["swallowed"]
    assert scope.cancelled_caught


async def test_a_future_of_another_loop_is_refused_inside_the_coroutine(loop: Any) -> None:
    async with trio_asyncio.open_loop() as other:
        foreign = other.create_future()

        async def body() -> None:
            await foreign

        with pytest.raises(RuntimeError, match="only futures of the driver's own loop"):
            await step_to_end(loop, body())


async def test_a_coroutine_that_ends_at_its_first_step_still_lets_other_tasks_run(
    loop: Any,
) -> None:
    # What asyncpg does with an argument it cannot encode: it raises before sending anything,
    # so the coroutine never waits. The pool takes a free slot without a pass of the scheduler
    # (0d2f22e), so without one here a loop of refused writes ran no other task at all.
    async def refused() -> None:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    async def at_once() -> int:
        return 1

    other = TurnCounter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other.run)
        await trio.lowlevel.checkpoint()
        before = other.turns
        for _ in range(10):
            with pytest.raises(UnicodeEncodeError):
                await step_to_end(loop, refused())
            assert await step_to_end(loop, at_once()) == 1
        assert other.turns - before >= 19
        nursery.cancel_scope.cancel()
