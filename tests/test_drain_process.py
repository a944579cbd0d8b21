# DESIGN's promise end to end, with a real process and a real signal: SIGTERM reaches the
# running job at once, the process exits well inside its grace, and the job loses no attempt.
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from jobs_trio.open_driver import open_driver
from jobs_trio.records import JobState
from tests.apps.drain_app import build_report

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


async def test_sigterm_interrupts_an_awaiting_job_and_the_process_exits_at_once(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with open_driver(url) as driver:
        job_id = await build_report.enqueue(driver, {"month": 11})
    log = tmp_path / "app.log"
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.apps.drain_app", url],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        async with open_driver(url) as driver:
            # Another process: no event to wait on, only its row, polled under a deadline.
            with trio.fail_after(20):
                while True:
                    record = await driver.get(job_id)
                    assert record is not None
                    if record.state is JobState.RUNNING:
                        break
                    await trio.sleep(0.05)
            sent = trio.current_time()
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                code = await process.wait()
            took = trio.current_time() - sent
            after = await driver.get(job_id)
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    output = log.read_text(errors="replace")
    assert code == 0, output
    assert took < 5, f"exit took {took:.2f}s of a 25s grace\n{output}"
    assert after is not None and after.state is JobState.READY, output
    assert after.attempts == 0  # attempts=1: a deploy must not have used it up
    assert after.last_error is not None and "interrupted" in after.last_error
    assert "jobs.worker.drain-signalled" in output and "jobs.attempt.interrupted" in output
