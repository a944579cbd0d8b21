# jobs_trio.testing as its users meet it: rounds on Trio's mock clock, an import that needs no
# pytest, and the packaged conformance suite run from outside the project against a new driver.
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

import jobs_trio
from jobs_trio import Backoff, ConfigError, JobContext, JobState, Registry
from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.testing import ManualClock, memory_driver, new_worker, run_until_idle
from jobs_trio.testing.conformance.helpers import claim_one
from tests.docs.test_docs import DOCS, FILE_MARK, blocks
from tests.helpers.process_helpers import ROOT

BACKOFF = Backoff(base=60.0, jitter=0.0)  # a mock minute, then two


def flaky_registry(failures: int) -> Registry:
    registry = Registry()

    @registry.job("t.flaky", attempts=failures + 1, backoff=BACKOFF)
    async def flaky(ctx: JobContext, payload: None) -> int:
        if ctx.attempt <= failures:
            raise ConnectionError("not yet")
        return ctx.attempt

    return registry


async def test_a_round_runs_retries_through_their_backoff_on_the_mock_clock(
    autojump_clock: object,
) -> None:
    registry = flaky_registry(failures=2)
    driver = memory_driver()
    job_id = await registry.get("t.flaky").enqueue(driver)
    start = trio.current_time()
    outcomes = await run_until_idle(new_worker(driver, registry))
    assert [(o.job_id, o.kind) for o in outcomes] == [
        (job_id, "retried"),
        (job_id, "retried"),
        (job_id, "completed"),
    ]
    # Both backoffs were waited out on Trio's clock (mock: no real time), and no more.
    assert trio.current_time() - start == pytest.approx(60.0 + 120.0)
    done = await driver.get(job_id)
    assert done is not None and done.state is JobState.COMPLETED and done.result == 3


async def test_without_wait_a_round_stops_when_nothing_is_due(autojump_clock: object) -> None:
    registry = flaky_registry(failures=1)
    driver = memory_driver()
    await registry.get("t.flaky").enqueue(driver)
    start = trio.current_time()
    assert [o.kind for o in await run_until_idle(new_worker(driver, registry), wait=False)] == [
        "retried"
    ]
    assert trio.current_time() == start


async def test_a_job_waiting_for_an_event_ends_the_round_until_the_event(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("t.paid")
    async def paid(ctx: JobContext, payload: None) -> object:
        return await ctx.step.wait_for_event("wait", "paid", timeout=7 * 24 * 3600)

    driver = memory_driver()
    job_id = await paid.enqueue(driver)
    worker = new_worker(driver, registry)
    start = trio.current_time()
    assert [o.kind for o in await run_until_idle(worker)] == ["suspended"]
    assert trio.current_time() == start  # the week-long timeout was not waited out
    await jobs_trio.send_event(driver, "paid", {"amount": 3})
    assert [o.kind for o in await run_until_idle(worker)] == ["completed"]
    done = await driver.get(job_id)
    assert done is not None and done.result == {"amount": 3}


async def test_a_driver_whose_clock_trio_does_not_move_is_refused(autojump_clock: object) -> None:
    registry = flaky_registry(failures=1)
    driver = MemoryDriver(clock=ManualClock())
    await registry.get("t.flaky").enqueue(driver)
    with pytest.raises(ConfigError, match="did not move") as caught:
        await run_until_idle(new_worker(driver, registry))
    assert "memory_driver()" in (caught.value.fix or "")


async def test_the_suite_s_failed_checks_show_their_values() -> None:
    """The packaged suite's asserts are rewritten by pytest like a test module's own: a driver's
    author sees what the driver answered, not a bare AssertionError."""
    with pytest.raises(AssertionError) as caught:
        await claim_one(memory_driver())  # nothing to claim
    assert "assert 0 == 1" in str(caught.value)


def test_importing_the_kit_needs_no_pytest() -> None:
    """An application's code may import jobs_trio.testing where no test tools are installed;
    only the conformance suite asks for them."""
    script = textwrap.dedent(
        """
        import sys
        for name in ("pytest", "_pytest", "pytest_trio", "hypothesis"):
            sys.modules[name] = None  # importing it now raises ImportError
        import jobs_trio.testing
        try:
            import jobs_trio.testing.conformance
        except ImportError:
            print("kit without pytest")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "kit without pytest"


# Beside the page's two files: the suite's driver fixture is the one their factory opened.
WHICH_DRIVER = """
import pytest
from my_driver import MyDriver
from test_my_driver import driver_factory

from jobs_trio.testing.conformance import driver, manual_clock


@pytest.mark.trio
async def test_the_suite_runs_on_my_driver(driver):
    assert type(driver) is MyDriver
"""


@pytest.mark.slow
def test_a_driver_of_its_own_runs_the_packaged_suite_as_the_docs_show(tmp_path: Path) -> None:
    """docs/howto-testing.md's two files, outside this project (their own directory, a
    pytest.ini without trio_mode): one import and one fixture run every conformance test."""
    files = [FILE_MARK.match(code) for _, code in blocks(DOCS / "howto-testing.md", "python")]
    written = {m["name"] for m in files if m}
    for m in files:
        if m:
            (tmp_path / m["name"]).write_text(m.string, encoding="utf-8")
    assert written == {"test_my_driver.py", "my_driver.py"}, written
    (tmp_path / "test_which_driver.py").write_text(WHICH_DRIVER, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"(\d+) passed in [\d.]+s", summary), summary
    # The same tests, one driver: as many as this project runs on its memory driver, plus one.
    ours = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "tests/conformance",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    on_memory = re.findall(r"^\S+\[(?:\S+-)?memory(?:-\S+)?\]$", ours.stdout, re.M)
    assert on_memory, ours.stdout[-2000:]
    assert int(summary.split()[0]) == len(on_memory) + 1
