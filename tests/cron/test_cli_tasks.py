# `jobs-trio tasks`: each declared task with its schedule, next and last fire (text and --json),
# a record a deploy left behind, and a fire by hand.
from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import TaskAdvance, TaskFire
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.cron_app import registry
from tests.ops.test_cli import Cli

APP = "tests.apps.cron_app"


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("JOBS_TRIO_DB", raising=False)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def create() -> None:
        # `tasks` only reads: like every read command it never creates a database.
        async with open_driver(url):
            pass

    trio.run(create)
    return url


def advance(url: str, task: str, scheduled: float) -> None:
    async def write() -> None:
        async with open_driver(url) as driver:
            job = registry.require("cron.tick").new_job({"scheduled_ts": scheduled})
            await driver.advance_task(
                TaskAdvance(task, None, scheduled, (TaskFire(scheduled, job),))
            )

    trio.run(write)


def test_tasks_lists_schedule_next_and_last_fire(run: Cli, url: str) -> None:
    code, out, _ = run("tasks", APP, "--db", url, "--json")
    assert code == 0
    [row] = json.loads(out)
    assert row["task"] == "cron.tick"
    assert row["schedule"] == "cron '* * * * * *' UTC" and row["missed"] == "latest"
    assert row["next_fire"] is not None and row["last_fired"] is None

    advance(url, "cron.tick", 1_800_000_000.0)
    advance(url, "reports.gone", 1_700_000_000.0)  # a task a later deploy removed
    code, out, _ = run("tasks", APP, "--db", url, "--json")
    rows = {row["task"]: row for row in json.loads(out)}
    assert rows["cron.tick"]["last_fired"] == 1_800_000_000.0
    assert rows["cron.tick"]["next_fire"] == 1_800_000_001.0  # the first time after the record
    assert rows["reports.gone"]["schedule"] is None
    code, out, _ = run("tasks", APP, "--db", url)
    assert code == 0
    assert "2027-01-15T08:00:00.000Z" in out  # cron.tick's last fire
    assert "(not declared: no longer fires)" in out


def test_fire_by_hand_enqueues_a_manual_fire(run: Cli, url: str) -> None:
    code, out, _ = run("tasks", APP, "--db", url, "--fire", "cron.tick")
    assert code == 0
    code, shown, _ = run("show", out.strip(), "--db", url, "--json")
    job = json.loads(shown)
    assert job["name"] == "cron.tick" and job["queue"] == "cron"
    assert json.loads(job["payload"])["manual"] is True
    # The schedule's record is untouched: no fire is on record.
    _, listed, _ = run("tasks", APP, "--db", url, "--json")
    assert json.loads(listed)[0]["last_fired"] is None


def test_firing_an_unknown_task_is_a_clear_error(run: Cli, url: str) -> None:
    code, _, err = run("tasks", APP, "--db", url, "--fire", "nope")
    assert code == 2
    assert "error [X_UNKNOWN_JOB]: no task named 'nope' is declared (known: cron.tick)" in err
