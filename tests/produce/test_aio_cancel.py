# jobs_trio.aio on the caller's sqlite3 connection, cancelled (a request's timeout) while its
# write waits in a worker thread: the job must not outlive the cancelled request. In a process
# of its own: an asyncio application never runs beside trio-asyncio.
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

import jobs_trio
from tests.helpers.app_process import ROOT

pytestmark = pytest.mark.slow


async def test_a_cancelled_enqueue_on_the_callers_connection_leaves_no_job(
    tmp_path: Path,
) -> None:
    """The cancel reaches the caller only once the write has let go of its connection: before,
    the caller's rollback landed mid-write and the job committed with its next request."""
    path = tmp_path / "jobs.db"
    async with jobs_trio.open_driver(f"sqlite:///{path}"):
        pass
    done = await trio.run_process(
        [sys.executable, "-m", "tests.apps.producer_app", "cancelled", str(path)],
        cwd=ROOT,
        capture_stdout=True,
    )
    assert done.stdout.decode().split() == ["0"]
