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


@registry.job("names.stuck", queue="q")
async def stuck(ctx: jobs_trio.JobContext, payload: Any) -> None:
    await trio.sleep_forever()


class _Hostile(Exception):
    """An error whose own text cannot be had: a worker stopped by it must still say so."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


async def _fail_with_a_body_running(
    driver: Any, how: str
) -> tuple[jobs_trio.Worker, BaseException | None]:
    """A worker running ``stuck`` is stopped without a drain: by an error of its driver
    (``failed``, ``hostile``), or by a cancel of the task that runs it (``outside``)."""
    outside = how == "outside"
    started = trio.Event()
    real_claim = driver.claim

    async def claim_then_fail(*args: Any, **kwargs: Any) -> Any:
        if started.is_set():
            if outside:
                await trio.sleep_forever()
            if how == "hostile":
                raise _Hostile
            raise ConfigError("the database refused this worker (test)", fix="none")
        started.set()
        return await real_claim(*args, **kwargs)

    driver.claim = claim_then_fail
    driver.settle_and_claim = None  # claims go through claim() alone
    worker = jobs_trio.Worker(
        driver,
        registry,
        queues=["q"],
        concurrency=2,
        stats_interval=None,
        claim_ahead=None,
    )
    raised: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await started.wait()
            while worker.slot_use()["q"][0] == 0:  # the body started
                await trio.sleep(0.01)
            await fast.enqueue(driver, None)  # wakes the claim loop: its claim fails
            if outside:
                nursery.cancel_scope.cancel()
    except BaseException as exc:  # the refusal, in whatever group
        raised = exc
    return worker, raised


_SAYS = {
    "failed": "ConfigError: [X_CONFIG] the database refused this worker (test) — fix: none",
    "hostile": "_Hostile: <str() of this error raised RuntimeError>",
    "outside": "cancelled from outside",
}


@pytest.mark.parametrize("how", list(_SAYS))
async def test_a_worker_stopped_without_a_drain_names_each_body_it_cut(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its lease lapses and it runs again with an attempt counted: before, nothing said so (the
    stopped line read abandoned=0)."""
    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with jobs_trio.open_driver("memory://") as driver:
        job_id = await stuck.enqueue(driver, None)
        worker, raised = await _fail_with_a_body_running(driver, how)
    assert (raised is None) == (how == "outside")
    named = [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.worker.run-abandoned"
    ]
    assert [f["job_id"] for f in named] == [job_id]
    assert named[0]["error"] == _SAYS[how]
    assert job_id in worker.stats().abandoned
    stopped = [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.worker.stopped"
    ]
    assert stopped[-1]["abandoned"] == 1
