# The LISTEN connection's notifications (drivers/postgres_listener.py): handed to the waiters as
# asyncpg reads them, not a pass of the asyncio loop later, and a listener that fails costs the
# connection nothing.
from __future__ import annotations

import logging
import traceback
from typing import Any

import pytest
import trio

from jobs_trio.testing.conformance.helpers import new_job
from tests.conftest import require_postgres
from tests.test_postgres_driver import driver_and_admin

pytestmark = pytest.mark.postgres

pytest.importorskip("asyncpg")


@pytest.fixture
def url() -> str:
    return require_postgres()


async def woken_by_one_enqueue(driver: Any) -> None:
    """Enqueue one job while waiting for work: only its NOTIFY can end the wait in time."""
    async with trio.open_nursery() as nursery:

        async def wait() -> None:
            with trio.fail_after(20):  # the wait's own timeout (60 s) would be a missed wake-up
                await driver.wait_for_work(["default"], timeout=60)
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        await driver.enqueue([new_job()])


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
        await woken_by_one_enqueue(driver)
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

        def wake(queue: str | None) -> None:
            if queue is not None and not raised:
                raised.append(queue)
                raise RuntimeError("a listener's bug")
            woke(queue)

        monkeypatch.setattr(listener, "wake", wake)
        caplog.set_level(logging.ERROR, logger="jobs_trio")
        await driver.wait_for_work(["default"], timeout=0)  # LISTEN
        await driver.enqueue([new_job()])  # its notification meets the bug
        await woken_by_one_enqueue(driver)  # the connection still reads and wakes
        assert raised == ["default"]
        [line] = [
            r for r in caplog.records if getattr(r, "event", "") == "jobs.driver.notify-failed"
        ]
        assert "a listener's bug" in line.fields["error"]  # type: ignore[attr-defined]
        assert driver.listening
