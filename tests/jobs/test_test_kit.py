# The test kit for applications (issue 47): enqueued / assert_enqueued / refute_enqueued read
# what the code under test enqueued, drain runs it all (jobs enqueued by jobs too, delays on the
# mock clock), and the pytest plugin's fixtures make a job test three lines.
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import jobs_trio
from jobs_trio import JobState
from jobs_trio.testing import (
    assert_enqueued,
    drain,
    enqueued,
    memory_driver,
    refute_enqueued,
)

registry = jobs_trio.Registry()


@registry.job("emails.welcome", queue="emails")
async def welcome(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
    pass


@registry.job("emails.remind", queue="emails")
async def remind(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
    pass


async def test_enqueued_finds_jobs_by_name_payload_queue_key_and_state(autojump_clock: Any) -> None:
    driver = memory_driver()
    first = await welcome.enqueue(driver, {"to": "ada"}, key="welcome:ada")
    await welcome.enqueue(driver, {"to": "bob"}, delay=60)
    await remind.enqueue(driver, {"to": "ada"})
    assert [j.id for j in await enqueued(driver, name="emails.welcome", payload={"to": "ada"})] == [
        first
    ]
    assert len(await enqueued(driver, name="emails.welcome")) == 2  # a delayed job is enqueued
    assert len(await enqueued(driver, queue="emails", payload=lambda p: p["to"] == "ada")) == 2
    assert len(await enqueued(driver, key="welcome:ada")) == 1
    assert await enqueued(driver, name="emails.welcome", state=JobState.COMPLETED) == []
    [job] = await assert_enqueued(driver, name="emails.remind", payload={"to": "ada"}, count=1)
    assert job.queue == "emails"
    await refute_enqueued(driver, name="emails.welcome", payload={"to": "eve"})


async def test_a_failed_assertion_lists_what_was_enqueued(autojump_clock: Any) -> None:
    driver = memory_driver()
    await welcome.enqueue(driver, {"to": "ada"})
    with pytest.raises(AssertionError) as missing:
        await assert_enqueued(driver, name="emails.welcome", payload={"to": "bob"})
    assert "name='emails.welcome', payload={'to': 'bob'}" in str(missing.value)
    assert 'emails.welcome [ready, queue emails] payload={"to":"ada"}' in str(missing.value)
    with pytest.raises(AssertionError, match="expected 2 job"):
        await assert_enqueued(driver, name="emails.welcome", count=2)
    with pytest.raises(AssertionError, match="expected no job"):
        await refute_enqueued(driver, payload={"to": "ada"})


async def test_drain_runs_jobs_enqueued_by_jobs_and_their_delays(autojump_clock: Any) -> None:
    driver = memory_driver()
    signups = jobs_trio.Registry()

    @signups.job("signup.create", queue="accounts")
    async def create(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> None:
        # A job that enqueues jobs: a welcome now and a reminder in three days.
        await welcome_too.enqueue(driver, {"to": payload["email"]})
        await remind_too.enqueue(driver, {"to": payload["email"]}, delay=3 * 86400)

    welcome_too = signups.job("emails.welcome", queue="emails")(welcome.fn)
    remind_too = signups.job("emails.remind", queue="emails")(remind.fn)

    await create.enqueue(driver, {"email": "ada"})
    outcomes = await drain(driver, signups)
    assert [(o.name, o.kind) for o in outcomes] == [
        ("signup.create", "completed"),
        ("emails.welcome", "completed"),
        ("emails.remind", "completed"),  # three mock days later
    ]
    await refute_enqueued(driver)
    assert len(await enqueued(driver, state=JobState.COMPLETED)) == 3


async def test_drain_fails_on_jobs_that_enqueue_jobs_without_end(autojump_clock: Any) -> None:
    """On a mock clock no time passes between rounds, so trio.fail_after never fired: the
    test hung. The bound names the job that keeps coming; exactly the bound ends quietly."""
    driver = memory_driver()
    loops = jobs_trio.Registry()

    @loops.job("again")
    async def again(ctx: jobs_trio.JobContext, payload: int) -> None:
        if payload < last:
            await again.enqueue(driver, payload + 1)

    last = 1_000_000
    await again.enqueue(driver, 0)
    with pytest.raises(AssertionError, match=r"50 attempts ran .*again x50"):
        await drain(driver, loops, max_attempts=50)
    last = 79  # payloads 50 to 79: 30 attempts, the bound, and nothing left due
    assert len(await drain(driver, loops, max_attempts=30)) == 30


PROJECT_TEST = """
from jobs_trio.testing import assert_enqueued, run_until_idle
from kit_jobs import welcome


async def test_welcome(memory_driver, jobs_worker, autojump_clock):
    await welcome.enqueue(memory_driver, {"to": "ada"}, delay=86400)
    await assert_enqueued(memory_driver, name="emails.welcome", payload={"to": "ada"})
    assert [o.kind for o in await run_until_idle(jobs_worker)] == ["completed"]
"""


@pytest.mark.slow
def test_the_pytest_plugin_gives_a_three_line_test_its_fixtures(tmp_path: Path) -> None:
    (tmp_path / "kit_jobs.py").write_text(
        "import jobs_trio\nregistry = jobs_trio.Registry()\n"
        '@registry.job("emails.welcome")\n'
        "async def welcome(ctx, payload: dict) -> None:\n    pass\n"
    )
    (tmp_path / "test_kit.py").write_text(PROJECT_TEST)

    def pytest_in(folder: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_kit.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(folder)},
        )

    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntrio_mode = true\njobs_trio_registry = kit_jobs:registry\n"
    )
    done = pytest_in(tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
