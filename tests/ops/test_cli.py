# The `jobs-trio` commands, run in-process through `main([...])` on a temporary SQLite file:
# what each prints (text and --json), and every user mistake as `error [CODE]` with exit 2.
from __future__ import annotations

import contextlib
import importlib
import json
import re
import sqlite3
import textwrap
from pathlib import Path

import pytest
import trio

from jobs_trio import FleetLimit
from jobs_trio._cli.main import main
from jobs_trio._core.records import JobRecord
from jobs_trio._jobs.registry import Registry
from jobs_trio._retention.pruner import Retention
from jobs_trio._run.worker import Worker
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.cli_app import registry as app_registry
from tests.helpers.worker_helpers import fresh_metrics

JOB_FIELDS = {
    "id", "name", "queue", "state", "attempts", "max_attempts", "last_error", "run_at",
    "created_at", "updated_at",
}  # fmt: skip


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("JOBS_TRIO_DB", raising=False)
    return f"sqlite:///{tmp_path / 'jobs.db'}"


class Cli:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, err
        return out

    def fails(self, *argv: str, code: str) -> str:
        """Exit 2 and exactly one line on stderr: `error [CODE]: cause — fix: ...`."""
        status, out, err = self(*argv)
        assert status == 2, (out, err)
        assert re.fullmatch(rf"error \[{code}\]: [^\n]+ — fix: [^\n]+\n", err), err
        return err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


def enqueue(cli: Cli, db: str, *argv: str) -> str:
    """``jobs-trio enqueue ARGV``: with ``--app`` when given, else unchecked (no worker here
    announces the names these tests enqueue)."""
    unchecked = [] if "--app" in argv else ["--any-name"]
    job_id = cli.ok("enqueue", *argv, *unchecked, "--db", db).strip()
    assert re.fullmatch(r"[0-9a-f]{27}", job_id), job_id
    return job_id


def settle_one_round(db: str, registry: Registry = app_registry) -> None:
    """Run every due job of ``registry`` (tests.apps.cli_app's) once, as a worker would."""

    async def tick() -> None:
        async with open_driver(db) as driver:
            worker = Worker(driver, registry, metrics=fresh_metrics(), stats_interval=None)
            await worker.tick()

    trio.run(tick)


def record_of(db: str, job_id: str) -> JobRecord:
    async def get() -> JobRecord | None:
        async with open_driver(db) as driver:
            return await driver.get(job_id)

    found = trio.run(get)
    assert found is not None
    return found


def drop_schema(url: str, schema: str) -> None:
    async def drop() -> None:
        options = {"schema": schema, "migrate": True, "drop_schema_on_close": True}
        async with open_driver(url, **options):
            pass

    trio.run(drop)


# Enqueue, show, list.


def test_enqueue_prints_the_id_and_show_tells_the_job(cli: Cli, db: str) -> None:
    job_id = enqueue(
        cli, db, "reports.build", "--payload", '{"month": 5}', "--delay", "60", "--key", "may"
    )
    out = cli.ok("show", job_id, "--db", db)
    assert f"id          {job_id}" in out
    assert re.search(r"state\s+ready \(due in \d", out)
    assert re.search(r"attempts\s+0/3", out)
    assert re.search(r"queue\s+default", out)
    assert re.search(r"key\s+may", out)
    assert re.search(r'payload\s+\{"month":5\}', out)
    assert re.search(r"created\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(\d.*ago\)", out)
    assert "steps (0): none recorded" in out


def test_enqueue_options_reach_the_job(cli: Cli, db: str) -> None:
    job_id = enqueue(
        cli, db, "x", "--queue", "q2", "--attempts", "7", "--priority", "-3", "--payload", "[1]"
    )
    shown = json.loads(cli.ok("show", job_id, "--db", db, "--json"))
    assert (shown["queue"], shown["max_attempts"], shown["priority"]) == ("q2", 7, -3)
    assert json.loads(shown["payload"]) == [1]


def test_a_second_enqueue_with_a_live_key_prints_the_first_id(cli: Cli, db: str) -> None:
    first = enqueue(cli, db, "x", "--key", "k")
    code, out, err = cli("enqueue", "x", "--key", "k", "--any-name", "--db", db)
    assert (code, out.strip()) == (0, first)
    assert "already holds key 'k'" in err


def test_a_key_window_holds_the_key_after_its_job_completed(cli: Cli, db: str) -> None:
    app = ("--app", "tests.apps.cli_app")
    first = enqueue(cli, db, "app.hello", *app, "--key", "hi:42", "--unique-for", "3600")
    settle_one_round(db)
    assert record_of(db, first).state.value == "completed"
    # Within the window the completed job still holds its key; a window that covers only dead
    # jobs, or none at all, lets a new one in.
    code, out, err = cli(
        "enqueue", "app.hello", *app, "--key", "hi:42", "--unique-for", "3600", "--db", db
    )
    assert (code, out.strip()) == (0, first)
    assert "a job in its window already holds key 'hi:42'" in err
    dead_only = ("--unique-for", "3600", "--unique-states", "dead")
    assert enqueue(cli, db, "app.hello", *app, "--key", "hi:42", *dead_only) != first


@pytest.mark.parametrize(
    ("flags", "code", "says"),
    [
        (["--unique-for", "60"], "X_CONFIG", "without --key"),
        (["--key", "k", "--unique-states", "dead"], "X_CONFIG", "without --unique-for"),
        (["--key", "k", "--unique-for", "60", "--unique-states", " , "], "X_CONFIG", "no state"),
        (["--key", "k", "--unique-for", "60", "--unique-states", "bogus"], "X_ARGUMENT", "bogus"),
        (["--key", "k", "--unique-for", "0"], "X_USAGE", "> 0"),
    ],
)
def test_a_key_window_given_wrong_is_refused_and_writes_nothing(
    cli: Cli, db: str, flags: list[str], code: str, says: str
) -> None:
    err = cli.fails("enqueue", "x", "--any-name", *flags, "--db", db, code=code)
    assert says in err
    assert not Path(db.removeprefix("sqlite:///")).exists()  # refused before anything opened


def test_show_json_has_the_documented_fields_and_the_step_records(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "app.steps", "--app", "tests.apps.cli_app", "--payload", '{"n": 4}')
    settle_one_round(db)
    shown = json.loads(cli.ok("show", job_id, "--db", db, "--json"))
    assert set(shown) >= JOB_FIELDS
    assert (shown["id"], shown["state"], shown["attempts"], shown["result"]) == (
        job_id,
        "completed",
        1,
        9,  # the value, not its JSON text (issue 46)
    )
    [step] = shown["steps"]
    assert (step["name"], step["status"], step["result"]) == ("double", "done", "8")
    assert step["finished_at"] >= step["started_at"]
    text = cli.ok("show", job_id, "--db", db)
    assert "steps (1):" in text
    assert re.search(r"double\s+done\s+\S+Z\s+\S+s\s+result 8", text)


def test_show_tells_the_attempt_history_in_text_and_json(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "app.fail", "--app", "tests.apps.cli_app")
    assert "attempts ended (0): none yet" in cli.ok("show", job_id, "--db", db)
    assert json.loads(cli.ok("show", job_id, "--db", db, "--json"))["history"] == []
    settle_one_round(db)  # dead-lettered: its one attempt raised
    shown = json.loads(cli.ok("show", job_id, "--db", db, "--json"))
    [ended] = shown["history"]
    assert (ended["seq"], ended["attempt"], ended["outcome"]) == (1, 1, "dead-lettered")
    assert ended["worker_id"] and ended["seconds"] >= 0 and ended["ended_at"] > 0
    assert "boom on purpose" in ended["error"]
    assert "Traceback (most recent call last):" in ended["traceback"]
    text = cli.ok("show", job_id, "--db", db)
    lines = text.splitlines()
    at = lines.index("attempts ended (1):")
    columns = ["#", "ATTEMPT", "OUTCOME", "WORKER", "ENDED", "RAN", "ERROR"]
    assert re.split(r"\s{2,}", lines[at + 1].strip()) == columns
    assert re.match(
        r"\s+1\s+1\s+dead-lettered\s+\S+\s+\S+ ago\s+\S+s\s+.*boom on purpose", lines[at + 2]
    )
    assert lines[at + 3] == "  (tracebacks: --json, or the dashboard's job page)"


def test_show_tells_a_jobs_orphanings_in_text_and_json(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "app.hello", "--app", "tests.apps.cli_app")
    assert "orphaned    never (no worker died under it)" in cli.ok("show", job_id, "--db", db)

    async def two_deaths() -> None:
        # Claimed with a lease already over (lease=0), as by a worker that died at once: the
        # next claim hands it back orphaned and takes it; the third only hands it back.
        async with open_driver(db) as driver:
            for worker_id in ("dies-1", "dies-2", "rescuer"):
                await driver.claim(["greetings"], 1, lease=0, worker_id=worker_id)

    trio.run(two_deaths)
    shown = json.loads(cli.ok("show", job_id, "--db", db, "--json"))
    assert (shown["state"], shown["attempts"], shown["orphans"]) == ("ready", 0, 2)
    assert [h["outcome"] for h in shown["history"]] == ["orphaned", "orphaned"]
    text = cli.ok("show", job_id, "--db", db)
    assert (
        "orphaned    2 times (of 5, uncounted; a suspect: it runs alone on an idle worker)" in text
    )

    async def dies_alone() -> None:
        # Run alone (a suspect), its worker dies again: dead-lettered X_KILLED_WORKER.
        async with open_driver(db) as driver:
            for worker_id, alone in (("dies-alone", True), ("rescuer", False)):
                await driver.claim(["greetings"], 1, lease=0, worker_id=worker_id, alone=alone)

    trio.run(dies_alone)
    text = cli.ok("show", job_id, "--db", db)
    # Ended: no longer told what a suspect does next, nor that the last orphaning went uncounted.
    assert "X_KILLED_WORKER" in text and "orphaned    3 times (of 5)\n" in text


def test_list_filters_by_state_and_queue_and_prints_a_json_array(cli: Cli, db: str) -> None:
    a = enqueue(cli, db, "app.hello", "--app", "tests.apps.cli_app")
    b = enqueue(cli, db, "app.fail", "--app", "tests.apps.cli_app")
    settle_one_round(db)
    c = enqueue(cli, db, "other", "--queue", "elsewhere")
    listed = json.loads(cli.ok("list", "--db", db, "--json"))
    assert [job["id"] for job in listed] == [c, b, a]  # newest first
    assert all(set(job) >= JOB_FIELDS for job in listed)
    dead = json.loads(cli.ok("list", "--db", db, "--json", "--state", "dead"))
    assert [job["id"] for job in dead] == [b]
    queued = json.loads(cli.ok("list", "--db", db, "--json", "--queue", "greetings"))
    assert [job["id"] for job in queued] == [a]
    text = cli.ok("list", "--db", db, "--limit", "2")
    lines = text.splitlines()
    columns = ["ID", "NAME", "QUEUE", "STATE", "ATTEMPTS", "RUN AT", "LAST ERROR"]
    assert re.split(r"\s{2,}", lines[0]) == columns
    assert [line.split()[0] for line in lines[1:]] == [c, b]
    assert "RuntimeError: boom on purpose" in lines[2]
    assert json.loads(cli.ok("list", "--db", db, "--json", "--state", "parked")) == []


# Retry and cancel.


def test_retry_puts_a_dead_job_back_to_ready_with_its_attempts_reset(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "app.fail", "--app", "tests.apps.cli_app")
    settle_one_round(db)
    assert record_of(db, job_id).state == "dead"
    out = cli.ok("retry", job_id, "--db", db)
    assert out.strip() == f"{job_id}: ready, attempts reset (0/1)"
    assert record_of(db, job_id).state == "ready"
    err = cli.fails("retry", job_id, "--db", db, code="X_STATE")
    assert "only dead, cancelled or parked" in err


def test_cancel_a_ready_job_then_retry_it_with_json(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "x")
    assert cli.ok("cancel", job_id, "--db", db).strip() == f"{job_id}: cancelled"
    cli.fails("cancel", job_id, "--db", db, code="X_STATE")
    shown = json.loads(cli.ok("retry", job_id, "--db", db, "--json"))
    assert (shown["id"], shown["state"]) == (job_id, "ready")


@pytest.mark.parametrize("command", ["show", "retry", "cancel"])
def test_an_unknown_id_is_a_not_found_error(cli: Cli, db: str, command: str) -> None:
    enqueue(cli, db, "x")
    err = cli.fails(command, "0123456789abcdef", "--db", db, code="X_NOT_FOUND")
    assert "no job with id '0123456789abcdef'" in err


# Stats and migrate.


def test_stats_counts_each_queue_by_state(cli: Cli, db: str) -> None:
    cli.ok("migrate", "--db", db)
    assert cli.ok("stats", "--db", db).strip() == "no jobs"
    enqueue(cli, db, "app.fail", "--app", "tests.apps.cli_app")
    settle_one_round(db)  # before the others: it would park the names it does not declare
    enqueue(cli, db, "x")
    enqueue(cli, db, "later", "--delay", "3600")
    enqueue(cli, db, "y", "--queue", "other")
    stats = json.loads(cli.ok("stats", "--db", db, "--json"))
    assert [s["queue"] for s in stats] == ["default", "other"]
    default, other = stats
    assert default["depth"]["ready"] == 2 and default["depth"]["dead"] == 1
    assert (default["dead"], default["due"]) == (1, 1)
    assert isinstance(default["oldest_ready_age"], float)
    assert (other["depth"]["ready"], other["due"], other["dead"]) == (1, 1, 0)
    lines = cli.ok("stats", "--db", db).splitlines()
    assert lines[0].split()[:3] == ["QUEUE", "READY", "RUNNING"]
    assert lines[1].split()[:5] == ["default", "2", "0", "0", "1"]


def test_migrate_on_sqlite_says_what_it_applied(cli: Cli, db: str) -> None:
    path = db.removeprefix("sqlite:///")
    first = cli.ok("migrate", "--db", db)
    assert re.fullmatch(rf"file '{re.escape(path)}': applied 1(, \d+)*\n", first), first
    assert cli.ok("migrate", "--db", db) == f"file '{path}': up to date\n"
    # A file's migration takes no locks to wait for: the PostgreSQL options are refused.
    status, _, err = cli("migrate", "--db", db, "--wait", "5")
    assert status == 2 and "does not take wait=" in err


# Where the database comes from.


def test_the_database_url_comes_from_the_environment(
    cli: Cli, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBS_TRIO_DB", db)
    job_id = cli.ok("enqueue", "x", "--any-name").strip()
    assert json.loads(cli.ok("list", "--json"))[0]["id"] == job_id


@pytest.mark.parametrize(
    "argv", [["list"], ["show", "x"], ["enqueue", "x"], ["stats"], ["worker", "tests.apps"]]
)
def test_no_database_url_at_all_is_an_error(cli: Cli, db: str, argv: list[str]) -> None:
    err = cli.fails(*argv, code="X_CONFIG")
    assert "no database URL was given" in err and "JOBS_TRIO_DB" in err


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite:///", "jobs.db"])
def test_a_bad_url_is_an_error(cli: Cli, url: str) -> None:
    cli.fails("list", "--db", url, code="X_CONFIG")


def test_a_file_that_is_not_a_database_is_refused_and_left_unchanged(
    cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 10)
    before = path.read_bytes()
    err = cli.fails("list", "--db", f"sqlite:///{path}", code="X_CONFIG")
    assert "is not a SQLite database" in err
    assert path.read_bytes() == before


def test_another_applications_database_is_refused_and_left_unchanged(
    cli: Cli, tmp_path: Path
) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()
    before = path.read_bytes()
    for argv in (["list"], ["enqueue", "x"], ["migrate"]):
        err = cli.fails(*argv, "--db", f"sqlite:///{path}", code="X_CONFIG")
        assert "another application" in err and "users" in err
    assert path.read_bytes() == before


def test_a_damaged_jobs_database_is_a_clear_error(cli: Cli, db: str, tmp_path: Path) -> None:
    enqueue(cli, db, "x")
    path = tmp_path / "jobs.db"
    data = bytearray(path.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # keep the header, wreck every page after it
    path.write_bytes(bytes(data))
    err = cli.fails("list", "--db", db, code="X_CONFIG")
    assert "not a usable SQLite database" in err


# Enqueue's checks: nothing is written when one fails.


def test_an_invalid_json_payload_names_the_problem_and_writes_nothing(
    cli: Cli, db: str, tmp_path: Path
) -> None:
    err = cli.fails("enqueue", "x", "--payload", "{to: 1}", "--db", db, code="X_PAYLOAD")
    assert "--payload: not valid JSON" in err and "line 1 column 2" in err
    assert not (tmp_path / "jobs.db").exists()


def test_a_payload_that_is_json_but_not_storable_writes_nothing(
    cli: Cli, db: str, tmp_path: Path
) -> None:
    err = cli.fails("enqueue", "x", "--payload", "[NaN]", "--db", db, code="X_PAYLOAD")
    assert "payload[0]" in err
    assert not (tmp_path / "jobs.db").exists()


def test_a_key_given_twice_in_a_payload_object_is_refused(
    cli: Cli, db: str, tmp_path: Path
) -> None:
    # json.loads keeps the last of the two values: the job got {"a": 2} where the operator
    # typed both, and nothing said one was dropped.
    payload = '{"n": {"a": 1, "a": 2}}'
    err = cli.fails("enqueue", "x", "--payload", payload, "--db", db, code="X_PAYLOAD")
    assert "--payload: the key 'a' is given twice in one object" in err
    assert not (tmp_path / "jobs.db").exists()


def test_an_integer_too_long_for_python_to_read_is_a_payload_error(
    cli: Cli, db: str, tmp_path: Path
) -> None:
    # Past 4,300 digits json.loads raises a plain ValueError (int_max_str_digits): it was
    # reported as X_UNEXPECTED, "a bug in jobs_trio".
    err = cli.fails("enqueue", "x", "--payload", "9" * 5000, "--db", db, code="X_PAYLOAD")
    assert "--payload: a value Python cannot read" in err and "as a string" in err
    assert not (tmp_path / "jobs.db").exists()


def test_a_row_written_outside_jobs_trio_as_a_blob_does_not_break_the_json_listing(
    cli: Cli, db: str, tmp_path: Path
) -> None:
    # One job whose payload another program stored as a BLOB made `list --json` (every job)
    # and `show --json` fail X_UNEXPECTED: one bad row hid them all.
    good = enqueue(cli, db, "x")
    bad = enqueue(cli, db, "x")
    with contextlib.closing(sqlite3.connect(tmp_path / "jobs.db")) as conn, conn:
        conn.execute("UPDATE jobs SET payload = CAST(payload AS BLOB) WHERE id = ?", (bad,))
    listed = {job["id"]: job for job in json.loads(cli.ok("list", "--db", db, "--json"))}
    assert listed[good]["payload"] == "null"
    assert listed[bad]["payload"] == "<4 bytes, not text: b'null'>"
    assert json.loads(cli.ok("show", bad, "--db", db, "--json"))["payload"].startswith("<4 bytes")


def test_with_app_the_declared_queue_and_attempts_apply(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "app.hello", "--app", "tests.apps.cli_app:registry")
    shown = json.loads(cli.ok("show", job_id, "--db", db, "--json"))
    assert (shown["queue"], shown["max_attempts"]) == ("greetings", 5)
    err = cli.fails(
        "enqueue", "app.hello", "--app", "tests.apps.cli_app", "--queue", "q", "--db", db,
        code="X_CONFIG",
    )  # fmt: skip
    assert "--queue 'q' differs from the 'greetings'" in err


def test_with_app_an_unknown_job_name_lists_the_known_ones(
    cli: Cli, db: str, tmp_path: Path
) -> None:
    err = cli.fails(
        "enqueue", "app.helo", "--app", "tests.apps.cli_app", "--db", db, code="X_UNKNOWN_JOB"
    )
    assert "no job named 'app.helo'" in err
    # The close matches first (issue 46), then the names it knows.
    assert (
        "did you mean 'app.hello' or 'app.fail'? it declares app.fail, app.hello, app.steps" in err
    )
    assert not (tmp_path / "jobs.db").exists()


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--delay", "-1"], "not a number of seconds >= 0"),
        (["--attempts", "0"], "'0' is not a whole number from 1 to 2147483647"),
        (["--priority", "high"], "'high' is not a whole number from -2147483648 to 2147483647"),
    ],
)
def test_bad_option_values_are_usage_errors(
    cli: Cli, db: str, argv: list[str], problem: str
) -> None:
    code, _, err = cli("enqueue", "x", *argv, "--db", db)
    assert code == 2 and problem in err


# The worker command's checks, all made before anything runs.


def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return name


def test_a_module_that_is_not_there(cli: Cli, db: str) -> None:
    err = cli.fails("worker", "no_such_app_xyz", "--db", db, code="X_IMPORT")
    assert "No module named 'no_such_app_xyz'" in err and "check the spelling" in err


def test_a_module_whose_dependency_is_missing(
    cli: Cli, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = app_module(tmp_path, monkeypatch, "needs_dep_app", "import not_installed_dep_xyz\n")
    err = cli.fails("worker", name, "--db", db, code="X_IMPORT")
    assert "No module named 'not_installed_dep_xyz'" in err
    assert "which is not installed here" in err


def test_a_module_that_raises_or_does_not_parse(
    cli: Cli, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raising = app_module(tmp_path, monkeypatch, "raising_app", "x = 1\nraise KeyError('cfg')\n")
    err = cli.fails("worker", raising, "--db", db, code="X_IMPORT")
    assert "KeyError: 'cfg'" in err and "raising_app.py, line 2" in err
    broken = app_module(tmp_path, monkeypatch, "broken_app", "def f(:\n")
    err = cli.fails("worker", broken, "--db", db, code="X_IMPORT")
    assert "SyntaxError" in err and "broken_app.py, line 1" in err


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("regs_app", "holds 2 registries (a, b)"),
        ("regs_app:c", "has no attribute 'c'"),
        ("regs_app:n", "is a int, not a jobs_trio.Registry"),
        ("plain_app", "holds no jobs_trio.Registry"),
        (":a", "does not name a module"),
    ],
)
def test_finding_the_registry(
    cli: Cli,
    db: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spec: str,
    problem: str,
) -> None:
    app_module(
        tmp_path, monkeypatch, "regs_app", "import jobs_trio\na = jobs_trio.Registry()\n"
        "b = jobs_trio.Registry()\nn = 3\n",
    )  # fmt: skip
    app_module(tmp_path, monkeypatch, "plain_app", "x = 1\n")
    err = cli.fails("worker", spec, "--db", db, code="X_CONFIG")
    assert problem in err


def test_a_registry_with_no_jobs_cannot_run_a_worker(
    cli: Cli, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = app_module(
        tmp_path, monkeypatch, "empty_app", "import jobs_trio\nregistry = jobs_trio.Registry()\n"
    )
    err = cli.fails("worker", name, "--db", db, code="X_CONFIG")
    assert "no queue to claim from" in err


def test_a_lease_too_short_for_any_claim_is_refused(cli: Cli, db: str) -> None:
    # --lease 0.001 used to start a worker that handed every claim back as late (thousands of
    # jobs.claim.late lines a second), ran nothing, and exited 0.
    err = cli.fails("worker", "tests.apps.cli_app", "--db", db, "--lease", "0.001", code="X_CONFIG")
    assert "lease=0.001 is shorter than 1 s" in err and "give lease >= 1 seconds" in err


class WorkerOpened(Exception):
    """Raised by a stand-in for open_worker once it has seen what the command gave it (the
    command ends, reporting it as unexpected)."""


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), Retention()),
        (
            ("--keep-finished", "12h", "--keep-dead", "30d", "--prune-every", "1m"),
            Retention(keep_finished=12 * 3600, keep_dead=30 * 86400, every=60),
        ),
        (("--keep-dead", "forever", "--prune-batch", "50"), Retention(keep_dead=None, batch=50)),
        (("--no-retention",), None),
    ],
)
def test_the_worker_command_takes_open_workers_retention(
    cli: Cli,
    db: str,
    monkeypatch: pytest.MonkeyPatch,
    flags: tuple[str, ...],
    expected: Retention | None,
) -> None:
    seen: dict[str, object] = {}

    def opened(driver: object, registry: object, **options: object) -> object:
        seen.update(options)
        raise WorkerOpened

    monkeypatch.setattr("jobs_trio._cli.main.open_worker", opened)
    cli("worker", "tests.apps.cli_app", "--db", db, *flags)  # the stand-in ends it
    assert seen["retention"] == expected


def test_worker_retention_flags_are_checked_before_anything_opens(cli: Cli, db: str) -> None:
    err = cli.fails("worker", "m", "--keep-finished", "soon", "--db", db, code="X_USAGE")
    assert "argument --keep-finished: 'soon' is not an age" in err
    err = cli.fails(
        "worker", "tests.apps.cli_app", "--no-retention", "--keep-dead", "7d", "--db", db,
        code="X_CONFIG",
    )  # fmt: skip
    assert "--no-retention was given with --keep-dead" in err
    err = cli.fails(
        "worker", "tests.apps.cli_app", "--prune-batch", "0", "--db", db, code="X_ARGUMENT"
    )
    assert "batch" in err


def test_no_command_and_help(cli: Cli) -> None:
    code, _, err = cli()
    assert code == 2 and "COMMAND" in err
    code, out, _ = cli("worker", "--help")
    assert code == 0 and "--concurrency" in out


# The demo.


def demo_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["JOB", "STATE"])
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split(None, 3))
    return rows


def test_the_demo_shows_every_outcome(cli: Cli, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs-demo.db'}"
    out = cli.ok("demo", "--db", url)  # the demo bounds its own waits (demo.PATIENCE)
    rows = demo_rows(out)
    by_name: dict[str, list[list[str]]] = {}
    for row in rows:
        by_name.setdefault(row[0], []).append(row)
    assert len(rows) == 8
    assert all(row[1:3] == ["completed", "1/3"] for row in by_name["demo.greet"])
    [flaky] = by_name["demo.flaky"]
    assert flaky[1:3] == ["completed", "2/3"] and "simulated outage" in flaky[3]
    [doomed] = by_name["demo.doomed"]
    assert doomed[1:3] == ["dead", "3/3"] and "simulated bug" in doomed[3]
    [long] = by_name["demo.long"]
    # Claimed twice, counted once: the drained attempt was handed back.
    assert long[1:3] == ["completed", "1/3"] and "interrupted" in long[3]
    assert "demo.long interrupted on attempt 1" in out
    assert re.search(r"demo\.long is ready again with attempts 0/3", out)
    assert "unexpected" not in out
    # Run again: the previous file goes, and the same outcomes come back.
    again = cli.ok("demo", "--db", url)
    assert "removed the previous demo database" in again
    assert [row[:3] for row in demo_rows(again)] == [row[:3] for row in rows]


def test_the_demo_runs_on_memory_too(cli: Cli) -> None:
    out = cli.ok("demo", "--db", "memory://")
    assert len(demo_rows(out)) == 8 and "unexpected" not in out


@pytest.mark.postgres
def test_migrate_on_postgresql_applies_the_migrations_once(
    cli: Cli, postgres_url: str, pg_schema: str
) -> None:
    try:
        first = cli.ok("migrate", "--db", postgres_url, "--schema", pg_schema)
        assert re.fullmatch(rf"schema '{pg_schema}': applied 1(, \d+)*\n", first)
        again = cli.ok(
            "migrate",
            "--db",
            postgres_url,
            "--schema",
            pg_schema,
            "--lock-timeout",
            "0.2",
            "--wait",
            "5",
        )
        assert again == f"schema '{pg_schema}': up to date\n"
    finally:
        drop_schema(postgres_url, pg_schema)


def test_schema_reaches_every_command_on_postgresql(
    cli: Cli, postgres_url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        cli.ok("migrate", "--db", postgres_url, "--schema", pg_schema)
        job_id = cli.ok(
            "enqueue", "app.greet", "--any-name", "--db", postgres_url, "--schema", pg_schema
        ).strip()
        monkeypatch.setenv("JOBS_TRIO_SCHEMA", pg_schema)
        shown = json.loads(cli.ok("show", job_id, "--db", postgres_url, "--json"))
        assert shown["id"] == job_id and shown["state"] == "ready"
        monkeypatch.delenv("JOBS_TRIO_SCHEMA")
        # The default schema does not hold it (and is not migrated here).
        status, _, err = cli("show", job_id, "--db", postgres_url)
        assert status == 2 and "error [" in err
    finally:
        drop_schema(postgres_url, pg_schema)


def test_schema_on_sqlite_is_refused(cli: Cli, db: str) -> None:
    err = cli.fails("list", "--db", db, "--schema", "other", code="X_CONFIG")
    assert "only PostgreSQL has schemas" in err


def test_stats_shows_jobs_waiting_on_a_fleet_limit(cli: Cli, db: str) -> None:
    limited = Registry()

    @limited.job("export.run", fleet_limit=FleetLimit(1))
    async def export(ctx: object, payload: object) -> None:
        return None

    async def hold_the_only_slot() -> None:
        async with open_driver(db) as driver:
            await export.enqueue_many(driver, [1, 2, 3])
            # One claim takes the slot and puts the other two off: ready, not failed.
            claims = await driver.claim(["default"], 3, lease=60.0, worker_id="w1")
            assert len(claims) == 1

    trio.run(hold_the_only_slot)
    [default] = json.loads(cli.ok("stats", "--db", db, "--json"))
    assert default["depth"]["ready"] == 2 and default["depth"]["running"] == 1
    assert default["limit_waiting"] == [{"job": "export.run", "limit": "slot", "waiting": 2}]
    text = cli.ok("stats", "--db", db)
    assert "Waiting on a fleet limit" in text
    assert text.splitlines()[-1].split() == ["default", "export.run", "slot", "2"]
    # And `show` of one of the two says why it has not run, and what its limit is.
    [waiting, *_] = json.loads(cli.ok("list", "--db", db, "--state", "ready", "--json"))
    assert waiting["waiting_on"] == "slot:export.run" and waiting["slots"] == 1
    shown = cli.ok("show", waiting["id"], "--db", db)
    assert "put off for a full slot of key 'export.run'" in shown
    assert "at most 1 at once of key 'export.run'" in shown
