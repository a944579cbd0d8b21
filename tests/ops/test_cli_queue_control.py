# `jobs-trio pause` / `resume` (issue 46): the pause is durable and shows in `stats`, a second
# pause says since when and by whom; `delete` and `run-now`, one job or every job a filter
# matches, with --dry-run first.
from __future__ import annotations

import json

import trio

from jobs_trio._core.records import NewJob, new_job_id
from jobs_trio.drivers._open_driver import open_driver
from tests.ops import test_cli as base
from tests.ops.test_cli_bulk import seed, states

Cli = base.Cli
cli = base.cli
db = base.db


def test_pause_shows_in_stats_and_resume_takes_it_back(cli: Cli, db: str) -> None:
    seed(db, [("mail.send", "mail", "ready"), ("report.build", "reports", "ready")])
    out = cli.ok("pause", "mail", "--by", "alice", "--db", db)
    assert out == (
        "mail: paused; none of its jobs is running: nothing of it starts until"
        " `jobs-trio resume mail`\n"
    )
    table = cli.ok("stats", "--db", db)
    assert "mail (paused)" in table and "reports (paused)" not in table
    stats = {q["queue"]: q for q in json.loads(cli.ok("stats", "--json", "--db", db))}
    assert (stats["mail"]["paused"], stats["reports"]["paused"]) == (True, False)
    again = cli.ok("pause", "mail", "empty", "--by", "bob", "--db", db)
    assert again.startswith("mail: already paused since ") and again.count("by alice") == 1
    assert "empty: paused;" in again  # a queue with no job yet can be paused
    [mail, empty] = json.loads(cli.ok("pause", "mail", "empty", "--json", "--db", db))
    assert (mail["queue"], mail["by"], mail["already"]) == ("mail", "alice", True)
    assert (empty["queue"], empty["by"], empty["already"]) == ("empty", "bob", True)
    assert cli.ok("resume", "mail", "never", "--db", db) == "mail: resumed\nnever: was not paused\n"
    stats = {q["queue"]: q for q in json.loads(cli.ok("stats", "--json", "--db", db))}
    assert not stats["mail"]["paused"] and stats["empty"]["paused"]


def test_pause_names_the_workers_holding_its_jobs_that_did_not_confirm(cli: Cli, db: str) -> None:
    # Worker "w" holds a running job of mail (leased 600 s) and never confirms: no worker
    # process runs here. The pause stands; the command says who and why, and exits 2.
    seed(db, [("mail.send", "mail", "running"), ("mail.send", "mail", "ready")])
    status, out, err = cli("pause", "mail", "--wait", "0.2", "--db", db)
    assert status == 2 and "[X_PAUSE_UNCONFIRMED]" in err and "mail" in err, err
    assert out.startswith(
        "mail: paused; 1 of the 1 worker(s) holding its jobs did not confirm within 0.2 s:\n"
        "  w: holds 1 job(s) of the queue, leased for "
    ), out
    assert "it may start the ones it holds for a slot until it hears the pause" in out
    [pause] = json.loads(cli.ok("stats", "--json", "--db", db))
    assert pause["paused"] is True
    status, out, _ = cli("pause", "mail", "--wait", "0", "--json", "--db", db)
    [answer] = json.loads(out)
    assert status == 2 and (answer["confirmed"], answer["already"]) == (False, True)
    assert [(u["worker_id"], u["jobs"]) for u in answer["unconfirmed"]] == [("w", 1)]


def test_pause_records_who_by_default_and_refuses_a_bad_queue_name(cli: Cli, db: str) -> None:
    seed(db, [("mail.send", "mail", "ready")])
    [pause] = json.loads(cli.ok("pause", "mail", "--json", "--db", db))
    assert pause["by"] is None or "@" in pause["by"]
    cli.fails("pause", "bad\x1bname", "--db", db, code="X_ARGUMENT")
    cli.fails("pause", "mail", "--by", " ", "--db", db, code="X_CONFIG")


def test_delete_one_job_or_a_filtered_set_after_a_dry_run(cli: Cli, db: str) -> None:
    ids = seed(
        db,
        [
            ("mail.send", "mail", "dead"),
            ("mail.send", "mail", "dead"),
            ("mail.send", "mail", "running"),
            ("mail.send", "mail", "ready"),
            ("report.build", "reports", "dead"),
        ],
    )
    out = cli.ok("delete", "--queue", "mail", "--dry-run", "--db", db)
    assert out.startswith("would delete 2 jobs; nothing was changed\n")
    assert states(db, ids[:2]) == ["dead", "dead"]
    assert cli.ok("delete", "--queue", "mail", "--db", db) == "deleted 2 jobs\n"
    err = cli.fails("delete", ids[2], "--db", db, code="X_STATE")
    assert "running" in err and "cancel it first" in err
    out = cli.ok("delete", ids[3], "--db", db)
    assert out == f"{ids[3]}: deleted (it was ready), with its steps and attempt history\n"
    cli.fails("delete", ids[3], "--db", db, code="X_NOT_FOUND")
    listed = {job["id"] for job in json.loads(cli.ok("list", "--json", "--db", db))}
    assert listed == {ids[2], ids[4]}


def test_run_now_makes_a_scheduled_job_due_and_refuses_a_dead_one(cli: Cli, db: str) -> None:
    [dead] = seed(db, [("mail.send", "mail", "dead")])
    later = NewJob(new_job_id(), "mail.send", "mail", "null", 3, delay=3600)

    async def write() -> None:
        async with open_driver(db) as driver:
            await driver.enqueue([later])

    trio.run(write)
    shown = json.loads(cli.ok("show", later.job_id, "--json", "--db", db))
    out = cli.ok("run-now", "--queue", "mail", "--dry-run", "--db", db)
    assert out.startswith("would run-now 1 job; nothing was changed\n") and later.job_id in out
    out = cli.ok("run-now", later.job_id, "--db", db)
    assert out == f"{later.job_id}: due now (attempts 0/3)\n"
    after = json.loads(cli.ok("show", later.job_id, "--json", "--db", db))
    assert after["run_at"] < shown["run_at"] - 3000
    err = cli.fails("run-now", dead, "--db", db, code="X_STATE")
    assert "retry it instead" in err
