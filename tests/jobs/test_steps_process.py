# A job drained in the middle of its third step, re-claimed by a second worker process: steps
# one and two are replayed from their records (not re-run), step three is re-run, and it ends.
from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.steps_app import three
from tests.helpers.app_process import app_process, wait_until

pytestmark = pytest.mark.slow


async def test_a_drain_mid_step_three_replays_steps_one_and_two_on_the_next_process(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'steps.db'}"
    notes = tmp_path / "steps.log"
    notes.touch()
    async with open_driver(url) as driver:
        job_id = await three.enqueue(driver, {"log": str(notes)})

        async def in_step_three() -> bool:
            return "step3 start" in notes.read_text()

        async def completed() -> bool:
            record = await driver.get(job_id)
            return record is not None and record.state is JobState.COMPLETED

        async with app_process(tmp_path / "first.log", "tests.apps.steps_app", url) as first:
            await wait_until("step three to start", 20, in_step_three)
            first.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                assert await first.wait() == 0
        drained = await driver.get(job_id)
        assert drained is not None and drained.state is JobState.READY
        assert drained.attempts == 0
        async with app_process(tmp_path / "second.log", "tests.apps.steps_app", url) as second:
            await wait_until("the job to complete", 20, completed)
            second.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                await second.wait()
        done = await driver.get(job_id)
    assert done is not None and done.result == [1, 2, 3] and done.attempts == 1
    lines = notes.read_text().splitlines()
    assert lines.count("step1 start") == 1 and lines.count("step2 start") == 1
    assert lines.count("step3 start") == 2 and lines.count("step3 done") == 1
