# A failed attempt's frames (its body's locals, its payload) are freed with its outcome, not left
# in a reference cycle for the garbage collector: the error's traceback holds the frame that held
# the error. A worker process collects young objects rarely (docs/cli.md), and a cycle per failed
# attempt kept ~6x the memory of a worker whose jobs fail with large locals (issue 44's review).
from __future__ import annotations

import gc
import logging
import weakref
from typing import Any

import pytest

import jobs_trio
from jobs_trio._core.records import OutcomeKind
from jobs_trio.testing import drain, memory_driver


class _Large:
    """Stands for what a body holds: a buffer, a parsed document."""


async def test_a_failed_attempts_locals_are_freed_without_a_collection(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # No line of it kept: pytest keeps each record, and a record keeps its exception.
    caplog.set_level(logging.ERROR, logger="jobs_trio")
    registry = jobs_trio.Registry()
    held: list[weakref.ref[_Large]] = []

    @registry.job("flaky", attempts=2)
    async def flaky(ctx: jobs_trio.JobContext, payload: Any) -> None:
        if ctx.attempt == 1:
            large = _Large()
            held.append(weakref.ref(large))
            raise ValueError("the first attempt fails")

    driver = memory_driver()
    await flaky.enqueue(driver)
    gc.disable()
    try:
        outcomes = await drain(driver, registry)
        assert [o.kind for o in outcomes] == [OutcomeKind.RETRIED, OutcomeKind.COMPLETED]
        assert len(held) == 1 and held[0]() is None
    finally:
        gc.enable()
