# A worker survives any job (issue 10, point 1): whatever BaseException a body raises, other than
# the worker's own cancellation, and whatever its error's text does, it is that job's failure
# with a readable error, and the worker goes on to the next job.
from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from jobs_trio import JobContext, Registry
from jobs_trio._core.records import JobState
from tests.helpers.worker_helpers import record, trio_driver, worker


class OwnBaseException(BaseException):
    """A KeyboardInterrupt-like BaseException of a body's own."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


def _raise(error: BaseException) -> Callable[[], None]:
    def body() -> None:
        raise error

    return body


HOSTILE = [
    (SystemExit(3), "SystemExit: 3"),
    (GeneratorExit(), "GeneratorExit"),
    (KeyboardInterrupt(), "KeyboardInterrupt"),
    (OwnBaseException("mine"), "OwnBaseException: mine"),
    (Unprintable(), "Unprintable: <str() of this error raised RuntimeError>"),
]


@pytest.mark.parametrize("in_thread", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize(("error", "stored"), HOSTILE, ids=[s for _, s in HOSTILE])
async def test_a_body_raising_anything_fails_only_its_own_job(
    error: BaseException, stored: str, in_thread: bool
) -> None:
    registry = Registry()
    raise_it = _raise(error)

    if in_thread:

        @registry.job("hostile", attempts=1)
        def hostile(ctx: JobContext, payload: None) -> None:
            raise_it()

    else:

        @registry.job("hostile", attempts=1)
        async def hostile(ctx: JobContext, payload: None) -> None:  # type: ignore[misc]
            await trio.lowlevel.checkpoint()
            raise_it()

    @registry.job("fine")
    async def fine(ctx: JobContext, payload: None) -> str:
        return "ok"

    driver = trio_driver()
    bad = await hostile.enqueue(driver)
    good = await fine.enqueue(driver)
    w = worker(driver, registry)
    outcomes = await w.tick()
    assert sorted(o.kind for o in outcomes) == ["completed", "dead-lettered"]
    r = await record(driver, bad)
    assert r.state is JobState.DEAD
    assert r.last_error is not None and stored in r.last_error, r.last_error
    assert (await record(driver, good)).state is JobState.COMPLETED
    # And the worker goes on: the next job runs.
    again = await fine.enqueue(driver)
    assert [o.kind for o in await w.tick()] == ["completed"]
    assert (await record(driver, again)).result == "ok"


async def test_a_result_too_deep_to_encode_fails_only_its_own_job() -> None:
    registry = Registry()

    @registry.job("deep", attempts=1)
    async def deep(ctx: JobContext, payload: None) -> object:
        nested: list[object] = []
        for _ in range(100_000):
            nested = [nested]
        return nested

    @registry.job("fine")
    async def fine(ctx: JobContext, payload: None) -> str:
        return "ok"

    driver = trio_driver()
    bad = await deep.enqueue(driver)
    await fine.enqueue(driver)
    w = worker(driver, registry)
    assert sorted(o.kind for o in await w.tick()) == ["completed", "dead-lettered"]
    r = await record(driver, bad)
    assert r.state is JobState.DEAD
    assert r.last_error is not None and "nested deeper than 100 levels" in r.last_error
