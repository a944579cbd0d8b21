# A worker stopped by an error (not drained) names each finished result it could not write, and
# only those: one it wrote while a body still unwound must not be reported lost (an operator
# who believed the report would run the job twice).
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio import ConfigError, JobState

registry = jobs_trio.Registry()


@registry.job("names.fast", queue="q")
async def fast(ctx: jobs_trio.JobContext, payload: Any) -> dict[str, int]:
    return {"ok": 1}


@registry.job("names.slow", queue="q")
async def slow(ctx: jobs_trio.JobContext, payload: Any) -> None:
    try:
        await trio.sleep(30)
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(0.3)  # a body that cleans up when cancelled


async def test_a_result_written_while_a_body_unwinds_is_not_reported_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim that would carry the fast job's settlement fails with an error that stops the
    worker; the settler writes the settlement alone (a write that takes a moment) while the
    slow body cleans up. Named at the claim's failure, it was reported lost and then written."""
    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with jobs_trio.open_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as driver:
        done = await fast.enqueue(driver, None)
        await slow.enqueue(driver, None)
        real_settle = driver.settle

        async def slow_settle(batch: Any) -> Any:
            await trio.sleep(0.05)  # a busy database
            return await real_settle(batch)

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise ConfigError("the database refused this worker (test)", fix="none")

        driver.settle = slow_settle  # type: ignore[method-assign]
        driver.settle_and_claim = refused  # type: ignore[attr-defined]
        worker = jobs_trio.Worker(
            driver, registry, queues=["q"], concurrency=2, stats_interval=None, claim_ahead=None
        )
        with pytest.raises(BaseException):  # noqa: B017 - the refusal, in whatever group
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
        job = await driver.get(done)
        assert job is not None
        named = [
            r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.settle-abandoned"
        ]
        if job.state is JobState.COMPLETED:
            assert named == [] and done not in worker.stats().abandoned
        else:  # not written: then it must be named
            assert done in worker.stats().abandoned and len(named) == 1
