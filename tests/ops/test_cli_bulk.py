# Bulk `retry` and `cancel` (issue 36): every job a filter matches (queue, name, state, age), a
# dry run that changes nothing, a bound on how many one command changes, and the refusals that
# keep a typo from touching a whole database; `list --name`.
from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from pathlib import Path

import trio

from jobs_trio._core.records import DeadLetter, JobState, NewJob, new_job_id
from jobs_trio.drivers._open_driver import open_driver
from tests.ops import test_cli as base

Cli = base.Cli
cli = base.cli
db = base.db


def seed(url: str, spec: list[tuple[str, str, str]]) -> list[str]:
    """One job per (name, queue, state) with state ready, running or dead, in order (a running
    or dead one is claimed as it is enqueued: put them before the ready ones of its queue)."""

    async def write() -> list[str]:
        ids = []
        async with open_driver(url) as driver:
            for name, queue, state in spec:
                job = NewJob(new_job_id(), name, queue, "null", 3)
                await driver.enqueue([job])
                ids.append(job.job_id)
                if state == "ready":
                    continue
                [claim] = await driver.claim([queue], 1, lease=600, worker_id="w")
                assert claim.job_id == job.job_id
                if state == "dead":
                    await driver.settle([DeadLetter(claim.lease, "boom")])
        return ids

    return trio.run(write)


def states(url: str, ids: list[str]) -> list[str]:
    async def read() -> list[str]:
        async with open_driver(url) as driver:
            return [str((await driver.get(job_id)).state) for job_id in ids]  # type: ignore[union-attr]

    return trio.run(read)


def age(url: str, job_id: str, seconds: float) -> None:
    """Make a job's last change ``seconds`` old, as if it had sat that long."""
    path = Path(url.removeprefix("sqlite:///"))
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE jobs SET updated_at = ? WHERE id = ?", (time.time() - seconds, job_id))


def test_retry_every_dead_job_of_a_queue_after_a_dry_run(cli: Cli, db: str) -> None:
    ids = seed(
        db,
        [
            ("mail.send", "mail", "dead"),
            ("mail.send", "mail", "dead"),
            ("mail.digest", "mail", "dead"),
            ("mail.send", "mail", "ready"),
            ("report.build", "reports", "dead"),
        ],
    )
    out = cli.ok("retry", "--queue", "mail", "--dry-run", "--db", db)
    assert out.startswith("would retry 3 jobs; nothing was changed\n")
    assert all(job_id in out for job_id in ids[:3]) and ids[4] not in out
    assert states(db, ids) == ["dead", "dead", "dead", "ready", "dead"]
    out = cli.ok("retry", "--queue", "mail", "--db", db)
    assert out == "retried 3 jobs\n"
    assert states(db, ids) == ["ready", "ready", "ready", "ready", "dead"]


def test_filters_narrow_by_name_and_age(cli: Cli, db: str) -> None:
    ids = seed(db, [("mail.send", "mail", "dead")] * 3 + [("mail.digest", "mail", "dead")])
    age(db, ids[0], 3 * 3600)
    age(db, ids[3], 3 * 3600)
    out = cli.ok("retry", "--name", "mail.send", "--older-than", "2h", "--json", "--db", db)
    answer = json.loads(out)
    assert answer == {
        "dry_run": False,
        "matched": [ids[0]],
        "retried": [ids[0]],
        "skipped": [],
        "more": False,
    }
    assert states(db, ids) == ["ready", "dead", "dead", "dead"]


def test_at_most_limit_jobs_change_and_the_rest_is_said(cli: Cli, db: str) -> None:
    ids = seed(db, [("mail.send", "mail", "dead")] * 3)
    code, out, err = cli("retry", "--queue", "mail", "--limit", "2", "--db", db)
    assert code == 0 and out == "retried 2 jobs\n"
    assert "more jobs may match: at most --limit 2 at a time" in err
    assert sorted(states(db, ids)) == ["dead", "ready", "ready"]
    assert states(db, ids)[0] == "dead"  # the newest first: the oldest is left


def test_bulk_cancel_leaves_running_jobs_unless_asked(cli: Cli, db: str) -> None:
    ids = seed(db, [("mail.send", "mail", "running"), ("mail.send", "mail", "ready")])
    assert cli.ok("cancel", "--queue", "mail", "--db", db) == "cancelled 1 job\n"
    assert states(db, ids) == ["running", "cancelled"]
    assert cli.ok("cancel", "--queue", "mail", "--state", "running", "--db", db) == (
        "cancelled 1 job\n"
    )

    async def flagged() -> bool:
        async with open_driver(db) as driver:
            record = await driver.get(ids[0])
            assert record is not None
            return record.state is JobState.RUNNING and record.cancel_requested

    assert trio.run(flagged)  # running: flagged, stopped at its worker's next renewal


def test_one_id_still_works_and_mixing_an_id_with_filters_is_refused(cli: Cli, db: str) -> None:
    [job_id] = seed(db, [("mail.send", "mail", "dead")])
    err = cli.fails("retry", job_id, "--queue", "mail", "--db", db, code="X_CONFIG")
    assert "was given an ID and filters" in err
    out = cli.ok("retry", job_id, "--db", db)
    assert out.startswith(f"{job_id}: ready, attempts reset")


def test_no_id_and_no_filter_changes_nothing(cli: Cli, db: str) -> None:
    ids = seed(db, [("mail.send", "mail", "ready")])
    for verb in ("retry", "cancel"):
        err = cli.fails(verb, "--db", db, code="X_CONFIG")
        assert "needs a job's ID or at least one filter" in err and "--dry-run" in err
    assert states(db, ids) == ["ready"]


def test_a_state_the_command_cannot_act_on_is_a_usage_error(cli: Cli, db: str) -> None:
    err = cli.fails("retry", "--state", "ready", "--db", db, code="X_USAGE")
    assert "invalid choice: 'ready'" in err


def test_list_filters_by_name(cli: Cli, db: str) -> None:
    ids = seed(db, [("mail.send", "mail", "ready"), ("mail.sender", "mail", "ready")])
    listed = json.loads(cli.ok("list", "--name", "mail.send", "--json", "--db", db))
    assert [job["id"] for job in listed] == [ids[0]]
