# A key's window through the API (issue 47): "at most one welcome mail per user per day" as
# enqueue(key=, unique_for=), the same through the producers, and the boundary's refusals.
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio import DuplicateJob, InvalidArgument
from jobs_trio.sync import Producer
from jobs_trio.testing import drain, memory_driver

registry = jobs_trio.Registry()


@registry.job("emails.welcome")
async def welcome(ctx: jobs_trio.JobContext, payload: dict[str, int]) -> None:
    pass


async def test_one_welcome_mail_per_user_per_day(autojump_clock: Any) -> None:
    driver = memory_driver()
    day = dt.timedelta(days=1)
    first = await welcome.enqueue(driver, {"user": 42}, key="welcome:42", unique_for=day)
    await drain(driver, registry)  # sent: the job is completed, and still holds its key
    assert await welcome.enqueue(driver, {"user": 42}, key="welcome:42", unique_for=day) == first
    with pytest.raises(DuplicateJob) as raised:
        await welcome.enqueue(
            driver, {"user": 42}, key="welcome:42", unique_for=day, on_duplicate="raise"
        )
    assert raised.value.existing_id == first
    await trio.sleep(day.total_seconds())  # a mock day later
    again = await welcome.enqueue(driver, {"user": 42}, key="welcome:42", unique_for=day)
    assert again != first


@pytest.mark.parametrize(
    "options, argument",
    [
        ({"unique_for": 60}, "unique_for"),  # no key
        ({"key": "k", "unique_for": 0}, "unique_for"),
        ({"key": "k", "unique_for": -1}, "unique_for"),
        ({"key": "k", "unique_for": float("inf")}, "unique_for"),
        ({"key": "k", "unique_states": ["dead"]}, "unique_states"),  # no window
        ({"key": "k", "unique_for": 60, "unique_states": ["gone"]}, "unique_states"),
    ],
)
async def test_a_bad_window_is_refused_before_any_write(
    options: dict[str, Any], argument: str
) -> None:
    driver = memory_driver()
    with pytest.raises(InvalidArgument, match=f"^\\[X_ARGUMENT\\] {argument}:"):
        await welcome.enqueue(driver, {"user": 1}, **options)
    assert await driver.list_jobs() == []


async def test_an_outbox_refuses_a_window(tmp_path: Path) -> None:
    async with jobs_trio.open_driver(f"sqlite:///{tmp_path / 'app.db'}") as app_db:
        with pytest.raises(jobs_trio.ConfigError, match="unique_for"):
            await welcome.enqueue(jobs_trio.Outbox(app_db), {"user": 1}, key="k", unique_for=60)


async def test_the_producers_keep_the_window(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with jobs_trio.open_driver(url) as driver:
        first = await welcome.enqueue(driver, {"user": 7}, key="welcome:7", unique_for=3600)
        await drain(driver, registry)
        with Producer(url) as producer:
            again = producer.enqueue(
                welcome, {"user": 7}, key="welcome:7", unique_for=3600, unique_states=["dead"]
            )
            assert again != first  # a window of dead jobs only: the completed one is no holder
            assert producer.enqueue(welcome, {"user": 7}, key="welcome:7", unique_for=60) == again
