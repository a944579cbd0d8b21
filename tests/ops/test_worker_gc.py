# The collector a `jobs-trio worker` process runs its jobs under: start-up's objects frozen and a
# young generation sized for a worker, unless --python-gc or the application's module set its
# own; and never the collector of a process that calls the CLI in-process (a test, an app).
from __future__ import annotations

import gc
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from jobs_trio._cli import main as cli_main
from jobs_trio._cli.collector import WORKER_YOUNG
from jobs_trio._cli.main import main
from jobs_trio._core.records import JobState
from jobs_trio._run.early_signals import EarlySignals
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.gc_app import registry
from tests.helpers.process_helpers import record, started, until, worker_processes

pytestmark = pytest.mark.slow


async def _settings_in_a_worker(tmp_path: Path, *options: str, env: dict[str, str]) -> Any:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url, migrate=True) as driver:
        job_id = await registry.require("gc.settings").enqueue(driver)
        async with worker_processes("tests.apps.gc_app", tmp_path, url, 1, *options, env=env) as [
            proc
        ]:
            await started([proc])

            async def completed() -> bool:
                return (await record(driver, job_id)).state is JobState.COMPLETED

            await until("the job completed", 30, completed)
            proc.signal(signal.SIGTERM)
            assert await proc.exit_code(within=15) == 0, proc.output()
        return (await record(driver, job_id)).result


async def test_a_worker_process_sizes_the_young_generation_and_freezes_nothing(
    tmp_path: Path,
) -> None:
    settings = await _settings_in_a_worker(tmp_path, env={"JOBS_TRIO_TEST_GC": ""})
    # This Python's own older thresholds kept (the test process runs the same Python).
    assert settings == {"thresholds": [WORKER_YOUNG, *gc.get_threshold()[1:]], "frozen": 0}


async def test_python_gc_keeps_pythons_collector(tmp_path: Path) -> None:
    settings = await _settings_in_a_worker(tmp_path, "--python-gc", env={"JOBS_TRIO_TEST_GC": ""})
    assert settings == {"thresholds": list(gc.get_threshold()), "frozen": 0}


async def test_an_applications_own_thresholds_are_left_as_it_set_them(tmp_path: Path) -> None:
    settings = await _settings_in_a_worker(tmp_path, env={"JOBS_TRIO_TEST_GC": "900,11,12"})
    assert settings == {"thresholds": [900, 11, 12], "frozen": 0}


def test_only_the_console_scripts_own_process_is_tuned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Called in-process (a test, an application), the process's collector is not the CLI's; as
    # the console script (which hands main() the signals it held, `early`), it is.
    tuned: list[bool] = []
    monkeypatch.setattr(cli_main, "tune_for_worker", tuned.append)
    monkeypatch.setattr(trio, "run", lambda *args: 0)
    argv = ["worker", "tests.apps.gc_app", "--db", f"sqlite:///{tmp_path / 'jobs.db'}"]
    assert main(argv) == 0
    assert tuned == []
    as_console = cast(EarlySignals, SimpleNamespace(received=[]))
    assert main(argv, early=as_console) == 0
    assert main([*argv, "--python-gc"], early=as_console) == 0
    assert tuned == [False, True]
