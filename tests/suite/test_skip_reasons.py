# The suite's summary says why each skipped test skipped, Trio tests included (issue 45: six
# skips printed "python.py:187: Skipped" and no reason). A pytest run of its own, on a file made
# here, with the one plugin that keeps the reasons (tests/helpers/skip_reasons.py).
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.process_helpers import ROOT

TESTS = """
import pytest
import trio


async def test_skipped_in_a_trio_test():
    pytest.skip("no server for this one")


async def test_skipped_inside_a_nursery():
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 0)
        pytest.skip("skipped among other tasks")


@pytest.fixture
async def needs_a_thing():
    pytest.skip("the thing is missing")
    yield


async def test_skipped_by_its_fixture(needs_a_thing):
    pass


def test_skipped_in_a_plain_test():
    pytest.skip("plain and simple")
"""


def test_every_skip_in_the_summary_says_why(tmp_path: Path) -> None:
    (tmp_path / "test_skips.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
            "pytest_trio.plugin", "-p", "tests.helpers.skip_reasons", "-ra", "-q", str(tmp_path),
        ],
        cwd=tmp_path,
        # Only the two plugins: the suite's others (hypothesis, xdist, ...) cost seconds to load.
        env={"PYTHONPATH": str(ROOT), "PATH": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    summary = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert sorted(line.split(": ", 1)[1] for line in summary) == [
        "no server for this one",
        "plain and simple",
        "skipped among other tasks",
        "the thing is missing",
    ], run.stdout + run.stderr
    assert all("test_skips.py:" in line for line in summary)
