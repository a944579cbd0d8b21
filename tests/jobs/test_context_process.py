# A real `jobs-trio worker` process on SQLite (tests/apps/context_app.py): the context variable
# the registry's restore hook sets from the enqueue's context is what the body reads, in an
# async body and in a sync body's thread, and a job enqueued without one reads the default.
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.context_app import registry
from tests.helpers.process_helpers import record, started, until, worker_processes

pytestmark = pytest.mark.slow


async def test_a_worker_process_restores_each_enqueues_tenant_around_its_body(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url) as driver:
        ids = [
            await registry.require("ctx.async").enqueue(driver, context={"tenant": "t1"}),
            await registry.require("ctx.sync").enqueue(
                driver, context={"tenant": "t2", "request": "r-7"}
            ),
            await registry.require("ctx.async").enqueue(driver),
        ]
        async with worker_processes("tests.apps.context_app", tmp_path, url, 1) as [proc]:
            await started([proc])

            async def all_completed() -> bool:
                states = [(await record(driver, i)).state for i in ids]
                return all(state is JobState.COMPLETED for state in states)

            await until("the three jobs completed", 30, all_completed)
            proc.signal(signal.SIGTERM)
            assert await proc.exit_code(within=15) == 0, proc.output()
        results = [(await record(driver, i)).result for i in ids]
    assert results == [
        {"tenant": "t1", "ctx.tenant": "t1"},
        {"tenant": "t2", "ctx.tenant": "t2", "ctx.request": "r-7"},
        {"tenant": "none"},
    ]
