# The dashboard in a real headless Chromium (issue 17): pages load from real SQLite and
# PostgreSQL databases, the filter form works, a job page shows its steps, a hostile name is
# text in the DOM, an action is refused when off. Screenshots go to $JOBS_TRIO_SCREENSHOTS
# (docs/images when refreshing the docs' pictures), else to the test's temporary directory.
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import attrs
import pytest
import trio

from tests.dashboard_site import open_site
from tests.process_helpers import ROOT

CHROMIUM = os.environ.get("JOBS_TRIO_CHROMIUM") or shutil.which("chromium") or ""


def _browser_or_skip() -> None:
    """Nothing when a browser test can run, else a skip saying what is missing (a failure
    under CI=true, where .ci/install-browser installs Debian's chromium)."""
    why = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "pip package playwright is not installed (it is in the test extra)"
    if why is None and not CHROMIUM:
        why = "no chromium on PATH: `apt-get install chromium` (see .ci/install-browser)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the browser test cannot run: {why}")
        pytest.skip(why)


KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
async def test_the_dashboard_in_a_real_browser(kind: str, tmp_path: Path) -> None:
    _browser_or_skip()
    shots = Path(os.environ.get("JOBS_TRIO_SCREENSHOTS") or tmp_path)
    async with open_site(kind, tmp_path) as site:
        # Playwright runs its own asyncio loop, which trio-asyncio (imported by the PostgreSQL
        # driver) has changed for this whole process: the browser is driven from a process of
        # its own, while this Trio loop serves the pages it asks for.
        jobs = json.dumps(attrs.asdict(site.jobs))
        save = str(shots) if kind == "sqlite" else ""
        done = await trio.run_process(
            [sys.executable, "-m", "tests.dashboard_browse", site.url, jobs, CHROMIUM, save],
            cwd=ROOT,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    if kind == "sqlite":
        assert (shots / "dashboard-queues.png").stat().st_size > 1000
