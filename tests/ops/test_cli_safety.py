# The CLI against hostile data and mistakes (issue 10, points 4 and 5): stored text printed
# escaped, read-only commands that create nothing, one-line errors with a correct fix, masked
# passwords, owner-only files, and a demo that deletes only the file it made.
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import trio

import jobs_trio.drivers.sqlite as sqlite_driver
from jobs_trio._core.errors import ConfigError, ValueRefused
from jobs_trio._core.records import NewJob
from jobs_trio._core.redaction import redact_url
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers._postgres_sql import check_schema_name
from tests.apps.hostile_app import HIDDEN_LINK
from tests.apps.hostile_app import registry as hostile_registry
from tests.helpers.process_helpers import JOBS_TRIO, ROOT
from tests.ops import test_cli as base

Cli = base.Cli
cli = base.cli  # the fixtures, under the names the tests ask for
db = base.db
enqueue = base.enqueue

EVIL = "evil\x1b[31mRED\x1b]0;pwned\x07"  # recolours the screen and retitles the window
EVIL_SHOWN = r"evil\x1b[31mRED\x1b]0;pwned\x07"
LINK_SHOWN = "\\x1b]8;;https://evil.example/\\x1b\\click here\\x1b]8;;\\x1b\\"
SECRET = "S3CRET"


def path_of(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def plant_hostile_job(url: str, *, name: str, queue: str, key: str | None = None) -> str:
    """A job whose stored name and queue hold terminal escapes. The library refuses such names
    at declaration now, so the row is written by hand, as an older release or another tool
    could have left it: the CLI must still print it safely."""
    path = path_of(url)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        [(job_id,)] = conn.execute("SELECT id FROM jobs ORDER BY created_at DESC LIMIT 1")
        conn.execute(
            "UPDATE jobs SET name = ?, queue = ?, key = ? WHERE id = ?", (name, queue, key, job_id)
        )
    return str(job_id)


# Stored text reaches the terminal escaped; --json stays exact.


def test_a_hostile_job_name_is_printed_escaped_by_list_and_show(cli: Cli, db: str) -> None:
    enqueue(cli, db, "plain.job")
    job_id = plant_hostile_job(db, name=EVIL, queue="q\x1b[2J", key="k\u202eevil")
    for argv in (["list"], ["show", job_id]):
        out = cli.ok(*argv, "--db", db)
        assert EVIL_SHOWN in out and r"q\x1b[2J" in out
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert r"k\u202eevil" in cli.ok("show", job_id, "--db", db)
    stats = cli.ok("stats", "--db", db)
    assert r"q\x1b[2J" in stats and "\x1b" not in stats
    shown = json.loads(cli.ok("show", job_id, "--db", db, "--json"))
    assert (shown["name"], shown["queue"], shown["key"]) == (EVIL, "q\x1b[2J", "k\u202eevil")
    [listed] = json.loads(cli.ok("list", "--db", db, "--json"))
    assert listed["name"] == EVIL


def test_a_hidden_link_in_an_error_is_printed_escaped(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "hostile.fail", "--app", "tests.apps.hostile_app")
    base.settle_one_round(db, hostile_registry)
    listed = cli.ok("list", "--db", db)
    shown = cli.ok("show", job_id, "--db", db)
    assert "\x1b" not in listed + shown
    assert r"\x1b]8;;https://evil.example/" in listed  # cut to the column's width
    assert LINK_SHOWN in shown
    [record] = json.loads(cli.ok("list", "--db", db, "--json"))
    assert HIDDEN_LINK in record["last_error"]


def test_the_bytes_a_real_process_prints_are_escaped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = {k: v for k, v in os.environ.items() if k != "JOBS_TRIO_DB"}

    def run(*argv: str | bytes) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*JOBS_TRIO, *argv], cwd=ROOT, env=env, capture_output=True, timeout=60, check=False
        )

    enqueued = run("enqueue", "plain.job", "--any-name", "--db", url)
    assert enqueued.returncode == 0, enqueued.stderr
    plant_hostile_job(url, name=EVIL, queue="default")
    listed = run("list", "--db", url)
    assert listed.returncode == 0, listed.stderr
    assert EVIL_SHOWN.encode() in listed.stdout
    assert b"\x1b" not in listed.stdout and b"\x07" not in listed.stdout
    as_json = run("list", "--db", url, "--json")
    assert json.loads(as_json.stdout)[0]["name"] == EVIL
    # Bytes that are not UTF-8 reach Python as lone surrogates: one line, exit 2.
    refused = run("enqueue", b"name-\xff", "--db", url)
    assert refused.returncode == 2
    assert refused.stderr.startswith(b"error [X_CONFIG]: the argument 'name-\\udcff' is not")
    assert refused.stderr.count(b"\n") == 1 and b"Traceback" not in refused.stderr


# Read-only commands open the database read-only: they never create, migrate or write it.


@pytest.mark.parametrize(
    "argv", [["list"], ["stats"], ["show", "1a22"], ["retry", "1a22"], ["cancel", "1a22"]]
)
def test_a_mistyped_path_is_no_database_and_nothing_is_created(
    cli: Cli, tmp_path: Path, argv: list[str]
) -> None:
    typo = tmp_path / "jbos.db"
    err = cli.fails(*argv, "--db", f"sqlite:///{typo}", code="X_CONFIG")
    assert f"no database at '{typo}'" in err and "check the path" in err
    assert list(tmp_path.iterdir()) == []


def test_reading_leaves_the_file_as_it_was(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "x")
    path = path_of(db)
    before = path.read_bytes(), path.stat().st_mtime_ns
    for argv in (["list"], ["stats"], ["show", job_id]):
        cli.ok(*argv, "--db", db)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    empty = path.with_name("empty.db")
    empty.touch()
    err = cli.fails("list", "--db", f"sqlite:///{empty}", code="X_CONFIG")
    assert "not a jobs_trio database yet" in err
    assert empty.stat().st_size == 0  # not migrated into one


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """The file made unwritable even for root (immutable), else by its mode."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        yield
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", path], check=False).returncode != 0:
        pytest.skip("running as root without chattr +i: cannot make a file read-only")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", path], check=True)


def test_a_read_only_file_can_be_read_and_a_write_is_not_worth_retrying(cli: Cli, db: str) -> None:
    job_id = enqueue(cli, db, "x")
    with read_only(path_of(db)):
        err = cli.fails("enqueue", "y", "--any-name", "--db", db, code="X_CONFIG")
        assert "cannot write to the SQLite database" in err and "writable" in err
        assert "retried" not in err and "retry" not in err
        assert job_id in cli.ok("list", "--db", db)


# memory:// dies with the command: refused by every one-shot command.


@pytest.mark.parametrize(
    "argv", [["enqueue", "x"], ["list"], ["show", "1a"], ["stats"], ["retry", "1a"], ["migrate"]]
)
def test_memory_is_refused_by_one_shot_commands(cli: Cli, argv: list[str]) -> None:
    err = cli.fails(*argv, "--db", "memory://", code="X_CONFIG")
    assert "memory:// lasts only as long as the process" in err
    assert "--db sqlite:///jobs.db" in err


# Every error: one line, cause and fix, exit 2, no traceback (Cli.fails checks the shape).


def test_numbers_no_driver_stores_are_usage_errors(cli: Cli, db: str) -> None:
    err = cli.fails(
        "enqueue", "x", "--priority", "99999999999999999999999", "--db", db, code="X_USAGE"
    )
    assert "argument --priority: '99999999999999999999999' is not a whole number from" in err
    err = cli.fails("enqueue", "x", "--delay", "1e308", "--db", db, code="X_USAGE")
    assert "argument --delay: '1e308' is more than 36525 days" in err
    cli.fails("list", "--limit", "1" + "0" * 5000, "--db", db, code="X_USAGE")
    # The worker's claim-ahead options, refused before anything is opened.
    err = cli.fails("worker", "m", "--claim-ahead", "-1", "--db", db, code="X_USAGE")
    assert "argument --claim-ahead: '-1' is neither 'auto' nor a whole number from 0" in err
    err = cli.fails("worker", "m", "--hold-limit", "0", "--db", db, code="X_USAGE")
    assert "argument --hold-limit: '0' is not a number of seconds > 0" in err
    assert not path_of(db).exists()


def test_a_payload_nested_too_deep_to_parse_is_refused(cli: Cli, db: str) -> None:
    deep = "[" * 30_000 + "]" * 30_000
    err = cli.fails("enqueue", "x", "--payload", deep, "--db", db, code="X_PAYLOAD")
    assert "nested deeper than the JSON parser can read" in err
    assert not path_of(db).exists()


def test_show_and_list_a_job_due_beyond_the_calendar(cli: Cli, db: str) -> None:
    # A row written before the CLI refused such delays (or by a library call that allowed it).
    job_id = enqueue(cli, db, "x")
    with contextlib.closing(sqlite3.connect(path_of(db))) as conn, conn:
        conn.execute("UPDATE jobs SET run_at = 1e308")
    shown = cli.ok("show", job_id, "--db", db)
    assert "epoch 1e+308s (beyond the calendar)" in shown
    listed = cli.ok("list", "--db", db)
    assert "in 3.17e+300y" in listed


def test_an_unexpected_error_is_one_line_and_the_traceback_is_on_request(
    cli: Cli, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli.ok("migrate", "--db", db)

    async def broken(self: object) -> None:
        raise RuntimeError("a bug\non two lines")

    monkeypatch.setattr(sqlite_driver.SqliteDriver, "stats", broken)
    err = cli.fails("stats", "--db", db, code="X_UNEXPECTED")
    assert r"unexpected RuntimeError: a bug\x0aon two lines" in err
    assert "JOBS_TRIO_TRACEBACK=1" in err
    monkeypatch.setenv("JOBS_TRIO_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="a bug"):
        base.main(["stats", "--db", db])


# URLs are echoed with the password masked.


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:S3CRET@host/db", "postgresql://app:***@host/db"),
        ("postgresql://app:S3@CR/ET@host:5432/db", "postgresql://app:***@host:5432/db"),
        ("postgresql://app@host/db?password=S3CRET&x=1", "postgresql://app@host/db?password=***&x=1"),
        ("postgresql://host/db", "postgresql://host/db"),
        ("sqlite:///jobs.db", "sqlite:///jobs.db"),
    ],
)  # fmt: skip
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (f"postgresql+asyncpg://app:{SECRET}@localhost/db", "write it as postgresql://app:***@"),
        (f"postgresql://app:{SECRET}@127.0.0.1:99999/db", "is malformed: Port out of range"),
        (f"mysql://app:{SECRET}@localhost/db", "unsupported database URL 'mysql://app:***@"),
    ],
)
def test_a_url_with_a_password_is_echoed_masked(cli: Cli, url: str, problem: str) -> None:
    err = cli.fails("list", "--db", url, code="X_CONFIG")
    assert problem in err and SECRET not in err


def test_a_schema_name_with_a_trailing_newline_is_not_an_identifier(cli: Cli) -> None:
    with pytest.raises(ConfigError, match="not a plain identifier"):
        check_schema_name("jobs_trio\n")
    err = cli.fails(
        "list", "--db", "postgresql://u@127.0.0.1/db", "--schema", "jobs\n", code="X_CONFIG"
    )
    assert r"schema name 'jobs\n' is not a plain identifier" in err


def on_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.mark.postgres
def test_a_missing_postgresql_database_says_to_create_it(cli: Cli, postgres_url: str) -> None:
    missing = on_database(postgres_url, f"jt_missing_{uuid.uuid4().hex[:8]}")
    err = cli.fails("list", "--db", missing, code="X_CONFIG")
    assert "has no such database" in err and "create it (CREATE DATABASE" in err
    assert "retry" not in err


@pytest.mark.postgres
def test_a_refused_login_masks_the_password_and_escapes_the_servers_message(
    cli: Cli, postgres_url: str
) -> None:
    # The server quotes the role name raw; this one is a hidden link, percent-encoded.
    role = "jt%1B%5D8%3B%3Bhttps%3A%2F%2Fevil.example%2F%1B%5Cnobody"
    parts = urlsplit(postgres_url)
    url = urlunsplit(parts._replace(netloc=f"{role}:{SECRET}@{parts.hostname}:{parts.port}"))
    err = cli.fails("list", "--db", url, code="X_CONFIG")
    assert "refused the login" in err and "check the user and password" in err
    assert SECRET not in err and "retry" not in err
    assert "\x1b" not in err and r'role "jt\x1b]8;;https://evil.example/\x1b\nobody"' in err


@pytest.mark.postgres
async def test_values_postgresql_cannot_store_are_refused_not_retried(
    postgres_url: str, pg_schema: str
) -> None:
    # Straight to the driver, past every check above it: its own answer is what is tested.
    def job(**fields: object) -> NewJob:
        return NewJob(
            job_id=uuid.uuid4().hex[:27], name="x", queue="q", payload="null", max_attempts=1,
            **fields,  # type: ignore[arg-type]
        )  # fmt: skip

    options = {"schema": pg_schema, "migrate": True, "drop_schema_on_close": True}
    async with open_driver(postgres_url, **options) as driver:
        for bad in (job(priority=2**40), job(key="nul\x00key")):
            with pytest.raises(ValueRefused) as refused:
                await driver.enqueue([bad])
            assert not refused.value.retryable
            assert "retrying fails the same way" in refused.value.fix
        assert await driver.list_jobs(state=None, queue=None, limit=10) == []


# New SQLite files are the owner's alone.


def test_a_new_database_file_is_readable_by_its_owner_only(cli: Cli, db: str) -> None:
    enqueue(cli, db, "x")
    assert stat.S_IMODE(path_of(db).stat().st_mode) == 0o600

    async def hold_open() -> list[int]:
        async with open_driver(db):
            return [stat.S_IMODE(os.stat(f"{path_of(db)}{s}").st_mode) for s in ("-wal", "-shm")]

    assert trio.run(hold_open) == [0o600, 0o600]  # SQLite gives them the database's mode
    mine = path_of(db).with_name("shared.db")
    mine.touch(mode=0o640)
    os.chmod(mine, 0o640)
    enqueue(cli, f"sqlite:///{mine}", "x")
    assert stat.S_IMODE(mine.stat().st_mode) == 0o640  # an existing file keeps its mode


# The demo deletes only the file it made.


def test_the_demo_never_deletes_a_file_it_did_not_make(cli: Cli, tmp_path: Path) -> None:
    prod = f"sqlite:///{tmp_path / 'prod.db'}"
    enqueue(cli, prod, "Demo.invoice-customer-42")  # `LIKE 'demo.%'` ignored case
    before = path_of(prod).read_bytes()
    err = cli.fails("demo", "--db", prod, code="X_CONFIG")
    assert "the demo did not create it" in err
    assert path_of(prod).read_bytes() == before

    demo = f"sqlite:///{tmp_path / 'jobs-demo.db'}"
    cli.ok("demo", "--db", demo)
    copy = tmp_path / "copy.db"
    shutil.copyfile(path_of(demo), copy)
    err = cli.fails("demo", "--db", f"sqlite:///{copy}", code="X_CONFIG")
    assert "a copy of a demo database, not the file the demo created" in err
    enqueue(cli, demo, "payroll.run")
    before = path_of(demo).read_bytes()
    err = cli.fails("demo", "--db", demo, code="X_CONFIG")
    assert "holds 1 job(s) that are not the demo's" in err
    assert path_of(demo).read_bytes() == before
