# The dashboard in a real headless Chromium (issues 17 and 36): pages load from real SQLite and
# PostgreSQL databases, the overview's sections (charts, queues, workers, cron tasks, the outbox)
# lay out, the open overview shows new work by itself, a job page shows each attempt's
# traceback, the filter form works, a hostile name is text in the DOM, an action is refused
# when off. Screenshots go to $JOBS_TRIO_SCREENSHOTS (docs/images when refreshing the docs'
# pictures), else to the test's temporary directory.
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import attrs
import pytest

from jobs_trio import Registry
from jobs_trio._core.records import NewJob, new_job_id
from tests.helpers.browser_process import a_browser
from tests.helpers.dashboard_site import TASK, open_site, seed_history

CHROMIUM = os.environ.get("JOBS_TRIO_CHROMIUM") or shutil.which("chromium") or ""
SHOTS = ("queues", "charts", "workers", "tasks", "outbox", "jobs", "job", "attempts")


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
    # The registry the workers run (--app): the cron task's schedule and next fire are shown.
    registry = Registry()

    @registry.task(TASK, every=600)
    async def nightly(ctx: object, payload: object) -> None: ...

    # Served reloading every second: the live update is seen within the test's patience.
    async with open_site(kind, tmp_path, refresh=1, registry=registry) as site:
        await seed_history(site.database, site.options)
        # Playwright runs its own asyncio loop, which trio-asyncio (imported by the PostgreSQL
        # driver) has changed for this whole process: the browser is driven from a process of
        # its own, while this Trio loop serves the pages it asks for.
        jobs = json.dumps(attrs.asdict(site.jobs))
        save = str(shots) if kind == "sqlite" else ""
        async with a_browser(
            "tests.helpers.dashboard_browse",
            site.url,
            jobs,
            CHROMIUM,
            save,
            log=tmp_path / "browse.log",
        ) as browse:
            said = await browse.said(within=120)
            assert said.startswith("LOADED "), said
            # New work while the page is open: three more jobs due in "emails".
            await site.writer.enqueue(
                [NewJob(new_job_id(), "mail.welcome", "emails", "{}", 3) for _ in range(3)]
            )
            await browse.tell("changed")
            await browse.ended(within=120)
    if kind == "sqlite":
        for name in SHOTS:
            assert (shots / f"dashboard-{name}.png").stat().st_size > 1000, name
