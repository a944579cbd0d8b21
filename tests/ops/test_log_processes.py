# Each long-running command run as an operator runs it, with --log-format json (issue 36): every
# line on stderr parses, carries the documented keys, and the lines an operator reads for (a
# finished attempt at INFO with its outcome and duration, a failure's traceback, the start and
# the end) are there; a command that fails logs its error as a record too.
from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.ops_app import registry
from tests.helpers.process_helpers import JOBS_TRIO, ROOT, until, worker_processes

pytestmark = pytest.mark.slow

REQUIRED = {"time", "level", "logger", "message"}


def records_of(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr`` as a JSON record; a line that does not parse fails the test."""
    records = []
    for number, line in enumerate(stderr.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"line {number} of stderr is not JSON: {line!r}\n{stderr}")
        assert isinstance(record, dict) and set(record) >= REQUIRED, line
        assert record["level"] in ("debug", "info", "warning", "error", "critical"), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"]), line
        if "event" in record:
            assert isinstance(record["fields"], dict), line
        records.append(record)
    return records


def events(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == name]


async def test_the_worker_logs_json_a_line_per_attempt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url) as driver:
        await registry.require("ops.ok").enqueue_many(driver, [{"n": n} for n in range(3)])
        await registry.require("ops.fail").enqueue(driver, None)
        async with worker_processes(
            "tests.apps.ops_app",
            tmp_path,
            url,
            1,
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "--metrics-port",
            "0",
        ) as [worker]:

            async def all_finished() -> bool:
                [ops] = [q for q in await driver.stats() if q.queue == "ops"]
                return ops.depth.get("completed", 0) == 3 and ops.depth.get("dead", 0) == 1

            await until("the four jobs to finish", 30, all_finished)
            worker.signal(signal.SIGTERM)
            assert await worker.exit_code(within=30) == 0, worker.output()
    records = records_of(worker.output())
    [started] = events(records, "jobs.worker.started")
    assert started["fields"]["queues"] == ["ops"]
    [serving] = events(records, "jobs.metrics.serving")
    assert serving["fields"]["port"] > 0
    # A completion is at INFO (a worker at the default level shows its work), with its duration.
    completed = events(records, "jobs.attempt.completed")
    assert len(completed) == 3 and {r["level"] for r in completed} == {"info"}
    for record in completed:
        fields = record["fields"]
        assert fields["job"] == "ops.ok" and fields["queue"] == "ops" and fields["attempt"] == 1
        assert isinstance(fields["seconds"], float) and fields["seconds"] >= 0
    [failed] = events(records, "jobs.attempt.failed")
    assert failed["level"] == "warning" and failed["fields"]["queue"] == "ops"
    traceback = failed["fields"]["traceback"]
    assert traceback.endswith('RuntimeError: line one\nline "two" = \x1b[31mred')
    # From the application's frame (tests/apps/ops_app.py), not the worker's; once a line: not
    # in its message, nor as an `exception` beside the field (issue 46).
    frames = re.findall(r'^  File "([^"]+)"', traceback, re.M)
    assert frames and frames[0].endswith("ops_app.py") and "_run" not in traceback, traceback
    assert "Traceback" not in failed["message"] and "exception" not in failed
    # A dead letter needs a look: at ERROR, with its exception (an error tracker's event).
    [dead] = events(records, "jobs.attempt.dead-lettered")
    assert dead["level"] == "error" and "RuntimeError: line one" in dead["fields"]["error"]
    assert dead["fields"]["queue"] == "ops"
    assert dead["exception"].count("Traceback (most recent call last)") == 1
    assert "ops_app.py" in dead["exception"] and "_run" not in dead["exception"]
    assert events(records, "jobs.worker.stopped")[0]["fields"]["abandoned"] == 0


@asynccontextmanager
async def a_dashboard(tmp_path: Path, *flags: str, said: str) -> AsyncIterator[Path]:
    """`jobs-trio dashboard --port 0 FLAGS` on a database holding one job, once its stderr (the
    file yielded) says ``said``; stopped with SIGINT, which it must answer with exit 0."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url) as driver:
        await registry.require("ops.ok").enqueue(driver, {"n": 1})
    log = tmp_path / "dashboard.log"
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [*JOBS_TRIO, "dashboard", "--db", url, "--port", "0", *flags],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:

        async def saying() -> bool:
            return said in log.read_text()

        await until(f"the dashboard to say {said!r}", 20, saying)
        yield log
        process.send_signal(signal.SIGINT)
        with trio.fail_after(20):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_the_dashboard_logs_json(tmp_path: Path) -> None:
    async with a_dashboard(tmp_path, "--log-format", "json", said="jobs.dashboard.serving") as log:
        [line] = [ln for ln in log.read_text().splitlines() if "jobs.dashboard.serving" in ln]
        base = json.loads(line)["fields"]["urls"].split()[0]
        async with httpx.AsyncClient() as client:
            page = await client.get(f"{base}/")
            assert page.status_code == 200 and "ops" in page.text
            assert (await client.get(f"{base}/jobs?state=nope")).status_code == 400
    records = records_of(log.read_text())
    [serving_record] = events(records, "jobs.dashboard.serving")
    assert serving_record["fields"]["actions"] is False
    # Said once: hypercorn's own "Running on" record is left out (issue 46: three times).
    assert sum(base in line for line in log.read_text().splitlines()) == 1


async def test_the_dashboard_says_where_it_listens_once(tmp_path: Path) -> None:
    async with a_dashboard(tmp_path, said="dashboard on http") as log:
        pass
    [where] = [ln for ln in log.read_text().splitlines() if "http://" in ln]  # the banner only
    assert where.startswith("dashboard on http://127.0.0.1:") and "(read-only)" in where


async def test_a_command_that_fails_logs_its_error_as_a_record(tmp_path: Path) -> None:
    done = await trio.run_process(
        [
            *JOBS_TRIO,
            "worker",
            "tests.apps.no_such_app",
            "--db",
            f"sqlite:///{tmp_path / 'jobs.db'}",
            "--log-format",
            "json",
        ],
        cwd=ROOT,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 2
    records = records_of(done.stderr.decode())
    [failed] = events(records, "jobs.cli.failed")
    assert failed["level"] == "error" and failed["fields"]["code"] == "X_IMPORT"
    assert "cannot import 'tests.apps.no_such_app'" in failed["fields"]["cause"]
    assert failed["fields"]["fix"]
    assert done.stdout == b""


async def test_the_worker_at_the_default_level_shows_each_completion(tmp_path: Path) -> None:
    # The complaint this answers: at INFO (the CLI's default) a worker that ran jobs printed
    # nothing after jobs.worker.started, because a completion was logged at DEBUG.
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url) as driver:
        job_id = await registry.require("ops.ok").enqueue(driver, {"n": 1})
        async with worker_processes("tests.apps.ops_app", tmp_path, url, 1) as [worker]:

            async def completed() -> bool:
                found = await driver.get(job_id)
                return found is not None and found.state is JobState.COMPLETED

            await until("the job to complete", 30, completed)

            async def logged() -> bool:
                return "jobs.attempt.completed" in worker.output()

            await until("the completion's log line", 10, logged)
            worker.signal(signal.SIGTERM)
            assert await worker.exit_code(within=30) == 0
    [line] = [ln for ln in worker.output().splitlines() if "jobs.attempt.completed" in ln]
    assert f" INFO jobs_trio: jobs.attempt.completed job_id={job_id} job=ops.ok queue=ops" in line
    assert re.search(r" attempt=1 seconds=\d+\.\d+$", line), line


async def test_the_relay_logs_json(tmp_path: Path) -> None:
    from jobs_trio import Outbox

    app_url = f"sqlite:///{tmp_path / 'app.db'}"
    jobs_url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(app_url) as app_db, open_driver(jobs_url):
        await registry.require("ops.ok").enqueue(Outbox(app_db), {"n": 1})
    log = tmp_path / "relay.log"
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [*JOBS_TRIO, "relay", app_url, jobs_url, "--poll", "0.1", "--log-format", "json"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:

        async def moved() -> bool:
            return "jobs.relay.moved" in log.read_text()

        await until("the relay to move the row", 20, moved)
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    records = records_of(log.read_text())
    assert events(records, "jobs.relay.started") and events(records, "jobs.relay.stopped")
    [moved_record] = events(records, "jobs.relay.moved")
    assert moved_record["fields"]["created"] == 1
