# `jobs-trio enqueue NAME` without --app (issue 46): checked against the names the fleet's workers
# declare (each announces its registry's jobs), refused with the close matches when none does,
# written to the queue and with the attempts they declare; `--any-name` enqueues unchecked, and
# a refusal writes nothing, not even a new database file.
from __future__ import annotations

import json
from pathlib import Path

import trio
import trio.testing

from jobs_trio import Registry
from jobs_trio._core.records import WorkerPresence
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.testing import new_worker
from tests.ops import test_cli as base

Cli = base.Cli
cli = base.cli
db = base.db


def announce(url: str, *workers: tuple[str, tuple[tuple[str, str, int], ...]]) -> None:
    """Record workers as their announcements would: (worker id, its declared jobs)."""

    async def write() -> None:
        async with open_driver(url) as driver:
            now = driver.now()
            for worker_id, jobs in workers:
                await driver.worker_seen(
                    WorkerPresence(
                        worker_id, "box", 1, ("mail",), 5, 0, "idle", "0.2.0", now, now, 15.0, jobs
                    )
                )

    trio.run(write)


def test_a_real_worker_announces_its_declared_jobs_and_enqueue_uses_them(cli: Cli, db: str) -> None:
    registry = Registry()

    @registry.job("mail.send", queue="mail", attempts=5)
    async def send(ctx: object, payload: object) -> None: ...

    @registry.job("report.build", queue="reports")
    async def build(ctx: object, payload: object) -> None: ...

    async def announced() -> str:
        async with open_driver(db) as driver:
            worker = new_worker(driver, registry, queues=["reports"], stats_interval=15.0)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await trio.testing.wait_all_tasks_blocked()
                [seen] = await driver.workers()
                assert seen.jobs == (("mail.send", "mail", 5), ("report.build", "reports", 3))
                # The command while the worker runs (it takes its announcement back as it
                # stops), from a thread: the CLI runs Trio of its own.
                out = await trio.to_thread.run_sync(
                    cli.ok, "enqueue", "mail.send", "--payload", '{"to": "a@b.c"}', "--db", db
                )
                await worker.stop()
        return str(out).strip()

    job_id = trio.run(announced)
    shown = json.loads(cli.ok("show", job_id, "--json", "--db", db))
    # Its declared queue and attempts, not "default" and 3: a worker on "mail" runs it.
    assert (shown["queue"], shown["max_attempts"]) == ("mail", 5)


def test_a_name_no_worker_declares_is_refused_with_the_close_matches(cli: Cli, db: str) -> None:
    announce(db, ("w1", (("mail.send", "mail", 5), ("mail.digest", "mail", 3))))
    err = cli.fails("enqueue", "mail.sned", "--db", db, code="X_UNKNOWN_JOB")
    assert "the registry of the 1 worker seen declares no job named 'mail.sned'" in err
    assert (
        "did you mean 'mail.send'" in err
        and "mail.digest" in err
        and "--any-name" in err
        and "--app" in err
    )
    assert json.loads(cli.ok("list", "--json", "--db", db)) == []
    # Asked for, it is written unchecked (to "default": no worker declares it).
    job_id = cli.ok("enqueue", "mail.sned", "--any-name", "--db", db).strip()
    assert json.loads(cli.ok("show", job_id, "--json", "--db", db))["queue"] == "default"


def test_given_queue_and_attempts_win_and_a_disagreeing_fleet_asks_for_them(
    cli: Cli, db: str
) -> None:
    announce(db, ("w1", (("mail.send", "mail", 5),)), ("w2", (("mail.send", "mail2", 5),)))
    err = cli.fails("enqueue", "mail.send", "--db", db, code="X_CONFIG")
    assert "different queue: 'mail', 'mail2'" in err and "give --queue" in err
    job_id = cli.ok("enqueue", "mail.send", "--queue", "mail2", "--attempts", "2", "--db", db)
    shown = json.loads(cli.ok("show", job_id.strip(), "--json", "--db", db))
    assert (shown["queue"], shown["max_attempts"]) == ("mail2", 2)


def test_with_no_worker_recorded_or_no_database_nothing_is_written(
    cli: Cli, db: str, tmp_path: Path
) -> None:
    err = cli.fails("enqueue", "mail.send", "--db", db, code="X_CONFIG")
    assert "no database" in err  # a mistyped path does not become a new file
    assert not (tmp_path / "jobs.db").exists()
    cli.ok("enqueue", "first.job", "--any-name", "--db", db)  # creates the file, unchecked
    err = cli.fails("enqueue", "mail.send", "--db", db, code="X_UNKNOWN_JOB")
    assert "no worker has announced itself on this database in the last hour" in err
    cli.fails(
        "enqueue", "x", "--any-name", "--app", "tests.apps.cli_app", "--db", db, code="X_CONFIG"
    )
