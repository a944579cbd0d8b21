# jobs_trio.aio on the caller's connection, cancelled (a request's timeout) while its write is
# under way: the job must not outlive the cancelled request, on sqlite3, asyncpg and psycopg.
# In a process of its own: an asyncio application never runs beside trio-asyncio.
from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

import jobs_trio
from tests.helpers.app_process import ROOT

pytestmark = pytest.mark.slow


async def test_a_cancelled_enqueue_on_the_callers_connection_leaves_no_job(
    tmp_path: Path,
) -> None:
    """The cancel reaches the caller only once the write has let go of its connection: before,
    the caller's rollback landed mid-write and the job committed with its next request."""
    path = tmp_path / "jobs.db"
    async with jobs_trio.open_driver(f"sqlite:///{path}"):
        pass
    done = await trio.run_process(
        [sys.executable, "-m", "tests.apps.producer_app", "cancelled", str(path)],
        cwd=ROOT,
        capture_stdout=True,
    )
    assert done.stdout.decode().split() == ["0"]


@pytest.fixture
async def pg_target(postgres_url: str, pg_schema: str) -> AsyncIterator[str]:
    async with jobs_trio.open_driver(
        postgres_url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ):
        yield f"{postgres_url}#{pg_schema}"


async def timed_out_then_committed(kind: str, target: str) -> dict[str, list[str]]:
    done = await trio.run_process(
        [sys.executable, "-m", "tests.apps.producer_app", "timed-out", kind, target, "200"],
        cwd=ROOT,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    seen: dict[str, list[str]] = json.loads(done.stdout)
    # Timeouts from 0 to 4 ms: some cut the write short, some come after it. Both must be
    # there for the test to say anything.
    assert seen["timed_out"] and seen["returned"]
    return seen


def assert_only_answered_jobs_committed(
    seen: dict[str, list[str]], requests: list[str] | None = None
) -> None:
    """Each caller then committed its transaction: an enqueue that answered an id has its job,
    one that timed out none (before: 28 of 42 on sqlite3, 18 of 53 on asyncpg, 24 of 68 on
    psycopg had theirs committed, each released into the transaction before the cancel was
    passed on). And the caller's transaction outlives the timeout: each request's own row
    (``requests``: one a call) committed."""
    committed = set(seen["committed"])
    assert sorted(committed & set(seen["timed_out"])) == []
    assert sorted(set(seen["returned"]) - committed) == []
    assert seen["requests"] == sorted(requests or seen["returned"] + seen["timed_out"])


async def migrated_file(tmp_path: Path) -> str:
    path = tmp_path / "jobs.db"
    async with jobs_trio.open_driver(f"sqlite:///{path}"):
        pass
    return str(path)


@pytest.mark.parametrize("kind", ["sqlite3", "sqlite3-autocommit"])
async def test_a_timed_out_enqueue_on_a_sqlite3_connection_that_commits_leaves_no_job(
    kind: str, tmp_path: Path
) -> None:
    """In autocommit the write is a transaction of its own, and committed although the await
    raised: 27 of 34 timeouts (the cancel's interrupt seldom lands on a statement). Rolled back
    now if the cancel comes before the COMMIT, and the answer returned if it comes during it."""
    seen = await timed_out_then_committed(kind, await migrated_file(tmp_path))
    assert_only_answered_jobs_committed(seen)


@pytest.mark.postgres
@pytest.mark.parametrize("client", ["asyncpg", "psycopg-async"])
async def test_a_timed_out_enqueue_in_a_postgres_transaction_that_commits_leaves_no_job(
    client: str, pg_target: str
) -> None:
    assert_only_answered_jobs_committed(await timed_out_then_committed(client, pg_target))


async def app_answer(*argv: str) -> dict[str, object]:
    done = await trio.run_process(
        [sys.executable, "-m", "tests.apps.producer_app", *argv],
        cwd=ROOT,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


async def test_a_write_cancelled_mid_statement_leaves_the_callers_transaction_whole(
    tmp_path: Path,
) -> None:
    """The statement is let finish, then undone: SQLite rolls an interrupted INSERT's whole
    transaction back, and the request's own row was lost by its next COMMIT (which said
    nothing) when the cancel interrupted it."""
    assert await app_answer("mid-statement", str(tmp_path / "app.db")) == {
        "cancelled": True,
        "requests": 1,
        "filler": 0,
    }


async def test_a_timed_out_enqueue_many_in_a_sqlite3_transaction_that_commits_leaves_none(
    tmp_path: Path,
) -> None:
    """100,000 jobs written and released in the thread while the request timed out: all of
    them committed with the request, whose await had raised."""
    path = tmp_path / "jobs.db"
    async with jobs_trio.open_driver(f"sqlite:///{path}"):
        pass
    assert await app_answer("large-timed-out", str(path)) == {
        "timed_out": True,
        "requests": 1,
        "jobs": 1,  # the producer's first, outside the request
    }


@pytest.mark.postgres
@pytest.mark.parametrize("client", ["asyncpg", "psycopg-async"])
async def test_a_timed_out_enqueue_outside_a_transaction_leaves_the_connection_outside_one(
    client: str, pg_target: str
) -> None:
    """A connection in autocommit: the write is a transaction of its own, committed when the
    await answers and not when it raises; and the connection is never left inside a
    transaction (a cancel during asyncpg's BEGIN left one open that no one committed, and every
    later enqueue on that connection answered an id and was lost with it)."""
    seen = await timed_out_then_committed(f"{client}-autocommit", pg_target)
    assert_only_answered_jobs_committed(seen)


@pytest.mark.postgres
@pytest.mark.parametrize("client", ["asyncpg", "psycopg-async"])
async def test_enqueues_in_one_transaction_hold_no_subtransaction_each(
    client: str, pg_target: str
) -> None:
    """Each write's savepoint is released. Left open, each nested in the one before and held a
    lock in the server's shared lock table: ~4,700 enqueues in one transaction ran it out
    (`out of shared memory`, for every session of the server), and a backend that walked
    8,000 nested contexts crashed the server."""
    answer = await app_answer("many-in-one", client, pg_target, "300")
    assert answer["jobs"] == 300
    assert answer["depth"] < 20 and answer["locks"] < 50  # 300+ each with the savepoints open


def assert_each_gathered_enqueue_kept_to_its_outcome(seen: dict[str, list[str]]) -> None:
    """Two enqueues gathered on one connection, one of them under a timeout: its rollback
    undid the other's savepoint, whose release then kept the timed-out one's job (psycopg: 14
    timed-out jobs committed and one answered id lost in 100 requests; sqlite3: 3 and 4). One
    write at a time on a connection now."""
    assert seen["timed_out"]  # some did, or this says nothing
    assert_only_answered_jobs_committed(seen, [f"r{i}" for i in range(100)])


async def test_two_enqueues_gathered_on_one_sqlite3_connection_keep_to_their_own_outcomes(
    tmp_path: Path,
) -> None:
    seen = await app_answer("gathered", "sqlite3", await migrated_file(tmp_path), "100")
    assert_each_gathered_enqueue_kept_to_its_outcome(seen)  # type: ignore[arg-type]


@pytest.mark.postgres
async def test_two_enqueues_gathered_on_one_psycopg_connection_keep_to_their_own_outcomes(
    pg_target: str,
) -> None:
    seen = await app_answer("gathered", "psycopg-async", pg_target, "100")
    assert_each_gathered_enqueue_kept_to_its_outcome(seen)  # type: ignore[arg-type]


@pytest.mark.postgres
@pytest.mark.parametrize("what", ["key", "check"])
@pytest.mark.parametrize("client", ["asyncpg", "psycopg-async"])
async def test_a_timeout_ends_an_enqueue_that_waits_for_a_lock(
    what: str, client: str, pg_target: str
) -> None:
    """A key whose live job another transaction holds, or a producer's first check while a
    migration holds the schema's tables: the statement is cancelled on the server when the
    timeout comes, and the request's own row still commits (the check, cut short on the
    caller's connection, failed the caller's transaction, and its COMMIT kept nothing)."""
    with trio.fail_after(60):  # an unbounded wait would never end: its holder waits for it
        answer = await app_answer("lock-waited", what, client, pg_target)
    assert answer == {"timed_out": True, "within_5s": True, "jobs": 0, "requests": 1}


async def test_a_timed_out_write_of_the_producers_own_on_sqlite_is_not_committed_after(
    tmp_path: Path,
) -> None:
    """No connection=: the write waited for the file's lock in its thread, the await raised at
    its timeout, and the job was committed once the lock was let go. Rolled back now."""
    answer = await app_answer("own-write-timed-out", await migrated_file(tmp_path))
    assert answer == {"timed_out": True, "jobs": 1}  # the first, before the lock
