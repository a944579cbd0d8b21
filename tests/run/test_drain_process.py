# DESIGN's promise end to end, with a real process and a real signal: SIGTERM reaches the
# running job at once, the process exits well inside its grace, and the job loses no attempt.
from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.drain_app import build_report
from tests.helpers.app_process import app_process, wait_until

pytestmark = pytest.mark.slow


async def test_sigterm_interrupts_an_awaiting_job_and_the_process_exits_at_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    log = tmp_path / "app.log"
    async with open_driver(url) as driver:
        job_id = await build_report.enqueue(driver, {"month": 11})

        async def running() -> bool:
            record = await driver.get(job_id)
            return record is not None and record.state is JobState.RUNNING

        async with app_process(log, "tests.apps.drain_app", url) as process:
            await wait_until("the job to start", 20, running)
            sent = trio.current_time()
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                code = await process.wait()
            took = trio.current_time() - sent
        after = await driver.get(job_id)
    output = log.read_text(errors="replace")
    assert code == 0, output
    # About a second alone: nothing waits out the grace (25 s), half of which is the bound.
    assert took < 12.5, f"exit took {took:.2f}s of a 25s grace\n{output}"
    assert after is not None and after.state is JobState.READY, output
    assert after.attempts == 0  # attempts=1: a deploy must not have used it up
    assert after.last_error is not None and "interrupted" in after.last_error
    assert "jobs.worker.drain-signalled" in output and "jobs.attempt.interrupted" in output
