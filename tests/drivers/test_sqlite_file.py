# The public check of a SQLite file (drivers/sqlite_migrate.identify): is it a jobs_trio
# database and at which schema version, read without creating or changing anything.
from __future__ import annotations

import sqlite3
from pathlib import Path

from jobs_trio.drivers._sqlite_migrate import SCHEMA_VERSION, FileKind, identify
from jobs_trio.drivers.sqlite import open_sqlite_driver


async def test_a_jobs_trio_file_says_its_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    async with open_sqlite_driver(f"sqlite:///{path}"):
        pass
    before = path.read_bytes()
    identity = identify(str(path))
    assert identity.kind is FileKind.JOBS_TRIO
    assert identity.schema_version == SCHEMA_VERSION
    assert "jobs" in identity.tables
    assert path.read_bytes() == before  # read-only: nothing written, migrated or checkpointed


def test_each_kind_of_file(tmp_path: Path) -> None:
    assert identify(str(tmp_path / "none.db")).kind is FileKind.MISSING
    assert not (tmp_path / "none.db").exists()
    (tmp_path / "empty.db").write_bytes(b"")
    assert identify(str(tmp_path / "empty.db")).kind is FileKind.NEW
    (tmp_path / "text.db").write_text("name,email\na,a@b.c\n")
    text = identify(str(tmp_path / "text.db"))
    assert text.kind is FileKind.NOT_SQLITE and "header" in text.problem
    (tmp_path / "broken.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    assert identify(str(tmp_path / "broken.db")).kind is FileKind.NOT_SQLITE
    with sqlite3.connect(tmp_path / "app.db") as conn:
        conn.execute("CREATE TABLE users (email TEXT)")
    app = identify(str(tmp_path / "app.db"))
    assert app.kind is FileKind.FOREIGN and app.tables == ("users",)
    assert app.schema_version == 0


async def test_the_driver_keeps_statement_journals_in_memory_checkpoints_seldom_caches_more(
    tmp_path: Path,
) -> None:
    # Issue 44: a multi-row claim or settle spilled its statement journal to a temporary file
    # (two writes a page), and a checkpoint every 1,000 pages copied the same hot pages again
    # and again; a large enqueue_many read its index pages back past SQLite's 2 MiB cache.
    # None of these settings changes what a commit makes durable.
    from jobs_trio.drivers._sqlite_migrate import CACHE_KIB, WAL_AUTOCHECKPOINT

    async with open_sqlite_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as driver:
        settings = await driver._transact(
            lambda conn, now: (
                conn.execute("PRAGMA temp_store").fetchone()[0],
                conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0],
                conn.execute("PRAGMA synchronous").fetchone()[0],
                conn.execute("PRAGMA cache_size").fetchone()[0],
            ),
            mode="bare",
        )
    # MEMORY, 8,000 pages, FULL kept, 16 MiB (negative: KiB)
    assert settings == (2, WAL_AUTOCHECKPOINT, 2, -CACHE_KIB)


def test_a_statement_sqlite_refuses_is_not_called_a_disk_fault() -> None:
    # SQLite's own refusal of a statement (a limit of its own, a missing table) is no fault of
    # the disk, and a retry fails the same way: a claim over 300 queues said "check the disk
    # (space, permissions)", and the call "can be retried".
    from jobs_trio.drivers._sqlite_door import file_error

    conn = sqlite3.connect(":memory:")
    refusals = [" UNION ALL ".join(["SELECT 1"] * 501), "SELECT * FROM jobs"]
    for sql in refusals:
        try:
            conn.execute(sql)
        except sqlite3.OperationalError as exc:
            error = file_error("/tmp/x.db", exc)
        else:
            raise AssertionError(f"SQLite ran {sql[:40]!r}")
        assert "refused a statement" in str(error)
        assert "check the disk" not in error.fix and "retry fails the same way" in error.fix
        assert "jobs-trio migrate" in error.fix


async def test_a_second_connection_leaves_this_process_counted_as_the_files_user(
    tmp_path: Path,
) -> None:
    # A second connection of the process (the lease lifeline's, a producer's in another thread,
    # a second driver) read the file's header with a descriptor of its own and closed it, which
    # drops every POSIX lock the process holds on the file. The next process to close the file
    # then took itself for its last user: it checkpointed and deleted the WAL this process went
    # on writing to, and those commits were lost (found by review, in real processes).
    import subprocess
    import sys

    from jobs_trio.drivers._sqlite_migrate import open_beside
    from jobs_trio.testing.conformance.helpers import new_job

    path = tmp_path / "jobs.db"
    count = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
        " print(c.execute('SELECT count(*) FROM jobs').fetchone()[0]); c.close()"
    )

    def another_process_counts() -> int:
        done = subprocess.run(
            [sys.executable, "-c", count, str(path)], capture_output=True, text=True, check=True
        )
        return int(done.stdout)

    async with open_sqlite_driver(f"sqlite:///{path}") as driver:
        await driver.enqueue([new_job()])
        open_beside(str(path), 5.0).close()
        assert another_process_counts() == 1
        assert (tmp_path / "jobs.db-wal").exists()  # not deleted under this process
        await driver.enqueue([new_job()])
        assert another_process_counts() == 2  # what it writes next, another process sees


async def test_a_file_a_killed_process_left_a_hot_journal_beside_opens_to_write(
    tmp_path: Path,
) -> None:
    # A process killed inside a write of a file still in rollback-journal mode (a new file's
    # first migration) leaves a hot journal, which the next connection to write rolls back.
    # The look before an open used a read-only connection, which cannot, and refused the file.
    import subprocess
    import sys

    path = tmp_path / "jobs.db"
    killed_mid_write = (
        "import os, sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
        " c.execute('CREATE TABLE t(x)'); c.execute('DROP TABLE t');"
        " c.execute('PRAGMA cache_size = 1'); c.execute('BEGIN IMMEDIATE');"
        " c.execute('CREATE TABLE t(x)');"
        " c.executemany('INSERT INTO t VALUES (?)', [(os.urandom(2000),) for _ in range(200)]);"
        " os._exit(9)"
    )
    subprocess.run([sys.executable, "-c", killed_mid_write, str(path)], check=False)
    assert (tmp_path / "jobs.db-journal").exists()
    async with open_sqlite_driver(f"sqlite:///{path}") as driver:
        assert await driver.claim(["default"], 1, lease=10, worker_id="w") == []
    assert not (tmp_path / "jobs.db-journal").exists()
