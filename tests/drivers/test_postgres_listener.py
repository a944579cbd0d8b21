# The LISTEN connection (drivers/postgres_listener.py): read by the listener's own task, its
# notifications handed to the waiters as asyncpg reads them, with no pass of the asyncio loop;
# its pings still answered; a listener that fails costs the connection nothing.
from __future__ import annotations

import logging
import traceback
from typing import Any

import pytest
import trio

from jobs_trio.drivers import _postgres_listener as postgres_listener
from jobs_trio.drivers.postgres import open_postgres_driver
from jobs_trio.testing.conformance.helpers import new_job
from tests.conftest import require_postgres
from tests.drivers.test_postgres_direct_reads import StepCounter
from tests.drivers.test_postgres_driver import driver_and_admin, open_admin

pytestmark = pytest.mark.postgres

pytest.importorskip("asyncpg")


@pytest.fixture
def url() -> str:
    return require_postgres()


async def woken_by_one_enqueue(driver: Any, queue: str) -> None:
    """Enqueue one job into ``queue`` (which holds none yet) while waiting for work there: only
    its NOTIFY can end the wait in time. The enqueue is sent once the wait's look at the next
    due time has answered: a task waiting for that reply counts as blocked, and an enqueue that
    committed before the look read would be seen by the look, not heard (a loaded machine)."""
    looked = trio.Event()
    look = driver._next_due_in

    async def looking(*args: Any, **kwargs: Any) -> float:
        try:
            due_in: float = await look(*args, **kwargs)
            return due_in
        finally:
            looked.set()

    driver._next_due_in = looking
    try:
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                # Ends the nursery by ending, never by cancelling it: the NOTIFY can be read
                # before the enqueue's own reply, and a cancel would cut the enqueue short (a
                # query cancel on the asyncio loop, which the test below must not see).
                with trio.fail_after(20):  # its own timeout (60 s) would be a missed wake-up
                    await driver.wait_for_work([queue], timeout=60)

            nursery.start_soon(wait)
            await looked.wait()
            await trio.testing.wait_all_tasks_blocked()  # the waiter parked on its wake-up
            await driver.enqueue([new_job(queue=queue)])
    finally:
        del driver._next_due_in


async def test_a_notification_wakes_its_waiter_as_it_is_read(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with driver_and_admin(url, pg_schema) as (driver, _):
        listener = driver._listener
        woke = listener.wake
        callers: list[list[str]] = []

        def wake(queue: str | None) -> None:
            if queue is not None:
                callers.append([frame.name for frame in traceback.extract_stack()])
            woke(queue)

        monkeypatch.setattr(listener, "wake", wake)
        await woken_by_one_enqueue(driver, "probe")
        # Inside asyncpg's handling of the message it read: not a callback the asyncio loop
        # ran on a later pass (asyncpg's own way, which delays each wake-up by that pass).
        assert callers and "_process_notification" in callers[0]


async def test_a_listener_that_raises_is_logged_and_the_next_notification_still_wakes(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with driver_and_admin(url, pg_schema) as (driver, _):
        listener = driver._listener
        woke = listener.wake
        raised: list[str] = []
        bug_met = trio.Event()

        def wake(queue: str | None) -> None:
            if queue is not None and not raised:
                raised.append(queue)
                bug_met.set()
                raise RuntimeError("a listener's bug")
            woke(queue)

        monkeypatch.setattr(listener, "wake", wake)
        caplog.set_level(logging.ERROR, logger="jobs_trio")
        await driver.wait_for_work(["first"], timeout=0)  # LISTEN
        await driver.enqueue([new_job(queue="first")])  # its notification meets the bug
        with trio.fail_after(10):
            await bug_met.wait()
        await woken_by_one_enqueue(driver, "second")  # the connection still reads and wakes
        assert raised == ["first"]
        [line] = [
            r for r in caplog.records if getattr(r, "event", "") == "jobs.driver.notify-failed"
        ]
        assert "a listener's bug" in line.fields["error"]  # type: ignore[attr-defined]
        assert driver.listening


async def test_a_notification_wakes_its_waiter_with_no_pass_of_the_asyncio_loop(
    url: str, pg_schema: str
) -> None:
    # One pooled connection: the enqueue waits for the look's, never opens one (on the loop).
    async with driver_and_admin(url, pg_schema, pool_size=1) as (driver, _):
        await driver.wait_for_work(["warm"], timeout=0)  # LISTEN, on the loop's path
        await driver.enqueue([new_job(queue="warm")])  # a pooled connection opened (the same)
        await trio.testing.wait_all_tasks_blocked()  # the listener's task took the reading over
        counter = StepCounter()
        trio.lowlevel.add_instrument(counter)
        try:
            await woken_by_one_enqueue(driver, "probe")
        finally:
            trio.lowlevel.remove_instrument(counter)
        # The enqueue reads its own reply (a pooled connection) and the listener's task reads
        # the notification: trio-asyncio's reader and loop tasks never ran.
        loop_tasks = [name for name in counter.stepped if name.startswith("trio_asyncio.")]
        assert loop_tasks == []
        assert any("read_while_open" in name for name in counter.stepped)


async def test_the_listen_connection_answers_its_pings_while_its_own_task_reads_it(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A ping is a statement run on the asyncio loop; its reply is read by the listener's task,
    # which must complete it as the loop would have: unread, every ping would time out and the
    # listener would reconnect, over and over.
    monkeypatch.setattr(postgres_listener, "PING_SECONDS", 0.01)
    caplog.set_level(logging.WARNING, logger="jobs_trio")
    async with driver_and_admin(url, pg_schema) as (driver, admin):
        listener = driver._listener
        ping = listener._ping
        answers: list[bool] = []
        read_by_the_loop: list[bool] = []
        three = trio.Event()

        async def counted_ping(conn: Any) -> bool:
            # The listener's task, not the loop, reads the socket while the ping waits: else
            # this test would pass with no reader of ours at all (the loop answering pings).
            read_by_the_loop.append(conn._transport.is_reading())
            answers.append(await ping(conn))
            if len(answers) == 3:
                three.set()
            return answers[-1]

        monkeypatch.setattr(listener, "_ping", counted_ping)
        listen_name = driver.bridge.application_name + ":listen"
        await driver.wait_for_work(["first"], timeout=0)  # LISTEN: the listener serves now
        [before] = await admin.backends(listen_name)
        with trio.fail_after(10):
            await three.wait()
        assert answers[:3] == [True, True, True]
        assert read_by_the_loop[:3] == [False, False, False]
        assert await admin.backends(listen_name) == [before]  # the same connection
        reconnects = [r for r in caplog.records if "reconnect" in getattr(r, "event", "")]
        assert reconnects == []
        await woken_by_one_enqueue(driver, "second")  # and it still hears notifications


async def test_the_listener_hands_reading_back_to_the_loop_before_its_connection_closes(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # asyncpg's close waits for the server's end of the connection, which only a reader sees:
    # closed while nobody read it, every close of a driver waited out the close's bound.
    read_by_the_loop_at_close: list[bool] = []
    async with open_admin(url) as admin:
        async with open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ) as driver:
            bridge = driver.bridge
            close = bridge.close_connection

            async def closing(conn: Any) -> None:
                read_by_the_loop_at_close.append(conn._transport.is_reading())
                await close(conn)

            monkeypatch.setattr(bridge, "close_connection", closing)
            listen_name = bridge.application_name + ":listen"
            await driver.wait_for_work(["q"], timeout=0)  # LISTEN: the listener's task reads
            await trio.testing.wait_all_tasks_blocked()
        assert read_by_the_loop_at_close == [True]
        assert await admin.backends(listen_name) == []
