# The applications of tests/produce/: a Flask-style handler (blocking) and a FastAPI-style one
# (asyncio) that enqueue a welcome job, a process that holds every kind of caller's transaction
# open after its enqueue until it is SIGKILLed, and one whose enqueue is cancelled. Apart
# because an asyncio application runs on a plain asyncio loop in a process of its own, never
# beside trio-asyncio.
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jobs_trio
import jobs_trio.aio
import jobs_trio.sync
from jobs_trio._core.records import JobId

registry = jobs_trio.Registry()


@registry.job("signup.welcome", queue="emails")
async def welcome(ctx: jobs_trio.JobContext, payload: dict[str, str]) -> dict[str, str]:
    return {"sent_to": payload["to"]}


@registry.job("signup.blocking", queue="emails")
async def blocking(ctx: jobs_trio.JobContext, payload: dict[str, float]) -> dict[str, str]:
    """Holds the worker's loop for ``payload["s"]`` seconds (a body that blocks it), then
    finishes: its result is what the worker has to write."""
    time.sleep(payload["s"])
    return {"slept": "yes"}


@registry.job("signup.elsewhere", queue="emails")
async def elsewhere(ctx: jobs_trio.JobContext, payload: dict[str, float]) -> None:
    """Moves the worker's working directory away, then holds its loop (as ``blocking``)."""
    os.chdir("/")
    time.sleep(payload["s"])


def flask_style_signup(
    producer: jobs_trio.sync.Producer, email: str, connection: object | None = None
) -> JobId:
    """A blocking request handler: the framework around it owns the transaction."""
    return producer.enqueue(welcome, {"to": email}, connection=connection)


async def fastapi_style_signup(
    producer: jobs_trio.aio.Producer, email: str, connection: object | None = None
) -> JobId:
    """An asyncio request handler: the framework around it owns the transaction."""
    return await producer.enqueue(welcome, {"to": email}, connection=connection)


# The asyncio paths, each one's transaction begun, committed or rolled back as its client does.


async def _asyncpg(url: str, producer: jobs_trio.aio.Producer, email: str, commit: bool) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        tx = conn.transaction()
        await tx.start()
        await fastapi_style_signup(producer, email, conn)
        await (tx.commit() if commit else tx.rollback())
    finally:
        await conn.close()


async def _psycopg_async(
    url: str, producer: jobs_trio.aio.Producer, email: str, commit: bool
) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        await fastapi_style_signup(producer, email, conn)  # psycopg's implicit transaction
        await (conn.commit() if commit else conn.rollback())


async def _sqlite_aio(
    path: str, producer: jobs_trio.aio.Producer, email: str, commit: bool
) -> None:
    conn = sqlite3.connect(path, check_same_thread=False)  # written from a worker thread
    try:
        await fastapi_style_signup(producer, email, conn)  # the DB-API's implicit transaction
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()


async def aio_handlers(sqlite_path: str, pg_url: str, schema: str) -> dict[str, list[str]]:
    """The FastAPI-style handler on every asyncio path: the producer's own connections, then
    each caller's transaction committed (``<path>:commit``) and rolled back."""
    async with (
        jobs_trio.aio.Producer(f"sqlite:///{sqlite_path}") as lite,
        jobs_trio.aio.Producer(pg_url, schema=schema) as pg,
    ):
        ids = {
            "sqlite": [await fastapi_style_signup(lite, "own@sqlite")],
            "postgres": [await fastapi_style_signup(pg, "own@postgres")],
        }
        for commit in (True, False):
            word = "commit" if commit else "rollback"
            await _sqlite_aio(sqlite_path, lite, f"sqlite3:{word}", commit)
            await _asyncpg(pg_url, pg, f"asyncpg:{word}", commit)
            await _psycopg_async(pg_url, pg, f"psycopg-async:{word}", commit)
    return ids


# Held open: every path's transaction after its enqueue, until the process is killed.

SYNC_HELD = ("sqlite3", "psycopg", "django-sqlite", "django-postgres")
AIO_HELD = ("sqlite3-aio", "asyncpg", "psycopg-async")


def _django(sqlite_path: str, pg_url: str) -> Any:
    from urllib.parse import urlsplit

    import django
    from django.conf import settings

    parts = urlsplit(pg_url)
    settings.configure(
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path},
            "pg": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": parts.path.lstrip("/") or "postgres",
                "USER": parts.username or "postgres",
                "HOST": parts.hostname or "127.0.0.1",
                "PORT": str(parts.port or 5432),
            },
        }
    )
    django.setup()
    from django.db import connections, transaction

    return connections, transaction


def hold_sync(folder: Path, pg_url: str, schema: str, kept: list[Any]) -> None:
    """Write on every blocking path inside a transaction left open (``kept`` keeps them)."""
    import psycopg

    lite = lambda name: jobs_trio.sync.Producer(f"sqlite:///{folder / name}.db")  # noqa: E731
    pg = jobs_trio.sync.Producer(pg_url, schema=schema)

    conn = sqlite3.connect(folder / "sqlite3.db")
    flask_style_signup(lite("sqlite3"), "held@sqlite3", conn)
    kept.append(conn)
    conn = psycopg.connect(pg_url)
    flask_style_signup(pg, "held@psycopg", conn)
    kept.append(conn)
    connections, transaction = _django(str(folder / "django-sqlite.db"), pg_url)
    for alias, producer, path in (
        ("default", lite("django-sqlite"), "django-sqlite"),
        ("pg", pg, "django-postgres"),
    ):
        atomic = transaction.atomic(using=alias)
        atomic.__enter__()  # left open: the process dies inside the block
        flask_style_signup(producer, f"held@{path}", connections[alias])
        kept.append(atomic)


async def hold_aio(folder: Path, pg_url: str, schema: str, kept: list[Any]) -> None:
    """Write on every asyncio path inside a transaction left open, say so, and wait to be
    killed."""
    import asyncpg
    import psycopg

    aio_lite = jobs_trio.aio.Producer(f"sqlite:///{folder / 'sqlite3-aio'}.db")
    aio_pg = jobs_trio.aio.Producer(pg_url, schema=schema)
    conn = sqlite3.connect(folder / "sqlite3-aio.db", check_same_thread=False)
    await fastapi_style_signup(aio_lite, "held@sqlite3-aio", conn)
    kept.append(conn)
    aconn = await asyncpg.connect(pg_url)
    await aconn.execute("BEGIN")
    await fastapi_style_signup(aio_pg, "held@asyncpg", aconn)
    kept.append(aconn)
    pconn = await psycopg.AsyncConnection.connect(pg_url)
    await fastapi_style_signup(aio_pg, "held@psycopg-async", pconn)
    kept.append(pconn)
    print("held", flush=True)
    await asyncio.sleep(3600)


async def cancelled_then_reused(path: str) -> None:
    """A request's enqueue on its sqlite3 connection cancelled (a timeout) while the file is
    write-locked elsewhere; the caller rolls back and serves its next request on the same
    connection, as a pool would, once the lock is free."""
    conn = sqlite3.connect(path, check_same_thread=False, timeout=0.5)
    conn.execute("CREATE TABLE IF NOT EXISTS visits (n INTEGER)")
    conn.commit()
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    async with jobs_trio.aio.Producer(f"sqlite:///{path}") as producer:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fastapi_style_signup(producer, "cancelled@x", conn), 0.1)
        conn.rollback()
        blocker.rollback()
        conn.execute("INSERT INTO visits VALUES (1)")  # the next request
        conn.commit()


async def _timed_out(enqueue: Any, tries: int, begin: Any, end: Any) -> dict[str, list[str]]:
    """``tries`` requests, each writing a row of its own (``begin``) and enqueueing under a
    timeout in one transaction, then committing it whatever the enqueue did (``end``: a handler
    that logs the timeout and goes on). The timeouts run from 0 to twice the slowest of five
    untimed enqueues after the first, so that some cut the write short and some come after it,
    on a busy machine too. Answers the emails of the enqueues that returned and timed out."""
    returned, timed_out = [], []
    slowest = 0.0
    for i in range(6):
        email = f"u{i}@x"
        await begin(email)
        started = time.perf_counter()
        await enqueue(email)
        if i:  # not the first: it checks the store too
            slowest = max(slowest, time.perf_counter() - started)
        returned.append(email)
        await end()
    rng = random.Random(44)
    for i in range(tries):
        email = f"t{i}@x"
        await begin(email)
        try:
            await asyncio.wait_for(enqueue(email), rng.uniform(0, 2 * slowest))
        except TimeoutError:
            timed_out.append(email)
        else:
            returned.append(email)
        await end()
    return {"returned": returned, "timed_out": timed_out}


async def _postgres_client(kind: str, url: str) -> tuple[Any, Any]:
    """An asyncpg or psycopg (async, autocommit: BEGIN and COMMIT as statements) connection, and
    a function that runs a statement with ``$n`` arguments on it and answers its rows."""
    if kind == "asyncpg":
        import asyncpg

        aconn = await asyncpg.connect(url)
        return aconn, aconn.fetch
    import psycopg

    pconn = await psycopg.AsyncConnection.connect(url, autocommit=True)

    async def sql(query: str, *args: object) -> list[Any]:
        cursor = await pconn.execute(query.replace("$1", "%s"), args or None)
        return await cursor.fetchall() if cursor.description is not None else []

    return pconn, sql


async def timed_out_then_committed(kind: str, target: str, tries: int) -> dict[str, list[str]]:
    """The enqueues of ``_timed_out`` on a caller's ``kind`` connection ("sqlite3" on the file
    ``target``, "asyncpg" or "psycopg-async" on ``target`` as URL#schema, either with
    "-autocommit": no transaction of the request's), and the emails of the jobs and of the
    requests' own rows committed."""
    if kind.startswith("sqlite3"):
        conn = sqlite3.connect(
            target,
            check_same_thread=False,  # written from a worker thread
            # "-autocommit": each statement commits on its own (the write in one of its own).
            isolation_level=None if kind.endswith("-autocommit") else "DEFERRED",
        )
        conn.execute("CREATE TABLE requests (email TEXT)")

        async def nothing(email: str) -> None:
            conn.execute("INSERT INTO requests VALUES (?)", (email,))  # the DB-API begins

        async def commit() -> None:
            conn.commit()

        async with jobs_trio.aio.Producer(f"sqlite:///{target}") as producer:
            seen = await _timed_out(
                lambda email: fastapi_style_signup(producer, email, conn), tries, nothing, commit
            )
        conn.close()
        # Read on a connection of its own: the caller's would see what it left uncommitted.
        with contextlib.closing(sqlite3.connect(target)) as reader:
            rows = reader.execute("SELECT payload FROM jobs").fetchall()
            requests = reader.execute("SELECT email FROM requests").fetchall()
    else:
        url, schema = target.rsplit("#", 1)
        # "-autocommit": the request has no transaction; each write commits on its own.
        outside = kind.endswith("-autocommit")
        conn, sql = await _postgres_client(kind.removesuffix("-autocommit"), url)
        await sql(f"CREATE TABLE {schema}.requests (email text)")

        async def begin(email: str) -> None:
            if not outside:
                await sql("BEGIN")
            await sql(f"INSERT INTO {schema}.requests VALUES ($1)", email)

        async def commit() -> None:
            if not outside:
                await sql("COMMIT")

        async with jobs_trio.aio.Producer(url, schema=schema) as producer:
            seen = await _timed_out(
                lambda email: fastapi_style_signup(producer, email, conn), tries, begin, commit
            )
        await conn.close()
        reader, sql = await _postgres_client("asyncpg", url)
        rows = await sql(f"SELECT payload::text FROM {schema}.jobs")
        requests = await sql(f"SELECT email FROM {schema}.requests")
        await reader.close()
    return {
        **seen,
        "committed": sorted(json.loads(row[0])["to"] for row in rows),
        "requests": sorted(row[0] for row in requests),
    }


def row_counts(conn: sqlite3.Connection, *tables: str) -> dict[str, int]:
    """How many rows each of ``tables`` holds, as ``conn`` sees them."""
    return {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in tables}


async def large_timed_out(path: str) -> dict[str, Any]:
    """A request that writes its own row, then enqueues 100,000 jobs on its sqlite3 connection
    under a timeout that comes while they are written, and commits whatever the enqueue did."""
    conn = sqlite3.connect(path, check_same_thread=False)  # written from a worker thread
    conn.execute("CREATE TABLE requests (email TEXT)")
    async with jobs_trio.aio.Producer(f"sqlite:///{path}") as producer:
        await producer.enqueue(welcome, {"to": "first@x"})  # the file checked, once
        conn.execute("INSERT INTO requests VALUES ('large@x')")
        payloads = [{"to": f"m{i}@x"} for i in range(100_000)]
        try:
            await asyncio.wait_for(producer.enqueue_many(welcome, payloads, connection=conn), 0.05)
            timed_out = False
        except TimeoutError:
            timed_out = True
        conn.commit()
    return {"timed_out": timed_out, **row_counts(conn, "requests", "jobs")}


async def cancelled_mid_statement(path: str) -> dict[str, Any]:
    """A request that writes its own row, then a producer's write on its sqlite3 connection
    whose statement runs for a while, cancelled while it runs; the request then commits."""
    from jobs_trio._produce.awaiting import on_callers_sqlite
    from jobs_trio.drivers._sqlite_enqueue import write_in

    conn = sqlite3.connect(path, check_same_thread=False)  # written from a worker thread
    conn.execute("CREATE TABLE requests (email TEXT)")
    conn.execute("CREATE TABLE filler (n INTEGER)")
    conn.commit()
    conn.execute("INSERT INTO requests VALUES ('slow@x')")  # the DB-API begins the transaction
    running = threading.Event()

    def long_write(c: sqlite3.Connection) -> str:
        running.set()
        c.execute(
            "INSERT INTO filler WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n"
            " LIMIT 2000000) SELECT i FROM n"
        )
        return "written"

    write = asyncio.ensure_future(
        on_callers_sqlite(conn, lambda open_, _: write_in(conn, long_write, leave_open=open_))
    )
    if not await asyncio.to_thread(running.wait, 30):
        raise SystemExit(f"the write never ran: {write}")
    write.cancel()
    try:
        await write
        cancelled = False
    except asyncio.CancelledError:
        cancelled = True
    conn.commit()
    return {"cancelled": cancelled, **row_counts(conn, "requests", "filler")}


async def gathered(kind: str, target: str, tries: int) -> dict[str, list[str]]:
    """``tries`` requests, each writing its own row and then two enqueues gathered on its one
    ``kind`` connection ("sqlite3", or "psycopg-async" on URL#schema), the first under a
    timeout, the second a moment later; then it commits."""
    if kind == "sqlite3":
        conn: Any = sqlite3.connect(target, check_same_thread=False)
        url, sql = f"sqlite:///{target}", None
        conn.execute("CREATE TABLE requests (email TEXT)")
        options: dict[str, str] = {}
    else:
        url, schema = target.rsplit("#", 1)
        conn, sql = await _postgres_client(kind, url)
        await sql(f"CREATE TABLE {schema}.requests (email text)")
        options = {"schema": schema}
    table = "requests" if sql is None else f"{options['schema']}.requests"
    jobs = "jobs" if sql is None else f"{options['schema']}.jobs"

    async def run(statement: str, *args: object) -> list[Any]:
        if sql is None:
            return conn.execute(statement.replace("$1", "?"), args).fetchall()  # type: ignore[no-any-return]
        return await sql(statement, *args)  # type: ignore[no-any-return]

    returned, timed_out = [], []
    rng = random.Random(7)
    async with jobs_trio.aio.Producer(url, **options) as producer:
        await fastapi_style_signup(producer, "warm@x")  # the store checked
        started = time.perf_counter()
        await fastapi_style_signup(producer, "warm@x")
        slowest = 2 * (time.perf_counter() - started)
        for i in range(tries):
            if sql is not None:
                await run("BEGIN")
            await run(f"INSERT INTO {table} VALUES ($1)", f"r{i}")

            async def first(email: str = f"a{i}@x") -> None:
                try:
                    await asyncio.wait_for(
                        fastapi_style_signup(producer, email, conn), rng.uniform(0, slowest)
                    )
                except TimeoutError:
                    timed_out.append(email)
                else:
                    returned.append(email)

            async def second(email: str = f"b{i}@x") -> None:
                await asyncio.sleep(rng.uniform(0, slowest / 2))
                await fastapi_style_signup(producer, email, conn)
                returned.append(email)

            await asyncio.gather(first(), second())
            if sql is None:
                conn.commit()
            else:
                await run("COMMIT")
    rows = await run(f"SELECT payload FROM {jobs}")
    requests = await run(f"SELECT email FROM {table}")
    await conn.close() if sql is not None else conn.close()
    return {
        "returned": returned,
        "timed_out": timed_out,
        "committed": sorted(
            json.loads(row[0])["to"] for row in rows if json.loads(row[0])["to"] != "warm@x"
        ),
        "requests": sorted(row[0] for row in requests),
    }


async def lock_waited(what: str, kind: str, target: str) -> dict[str, Any]:
    """An enqueue in a request's transaction on its ``kind`` connection that waits for a lock
    another transaction holds (``what``: "key", the same key's live job uncommitted; "check",
    the schema's tables, as a migration would hold them, at a producer's first call), under a
    0.5 s timeout: whether it timed out in time, and what the request's commit kept."""
    import asyncpg

    url, schema = target.rsplit("#", 1)
    holder = await asyncpg.connect(url)
    conn, sql = await _postgres_client(kind, url)
    await sql(f"CREATE TABLE {schema}.requests (email text)")
    async with jobs_trio.aio.Producer(url, schema=schema) as producer:
        await holder.execute("BEGIN")
        if what == "key":
            await producer.enqueue(welcome, {"to": "held@x"}, key="k", connection=holder)
        else:
            await holder.execute(
                f"LOCK TABLE {schema}.schema_history, {schema}.migrations IN ACCESS EXCLUSIVE MODE"
            )
        await sql("BEGIN")
        await sql(f"INSERT INTO {schema}.requests VALUES ('waited@x')")
        started = time.monotonic()
        try:
            await asyncio.wait_for(
                producer.enqueue(welcome, {"to": "waited@x"}, key="k", connection=conn), 0.5
            )
            timed_out = False
        except TimeoutError:
            timed_out = True
        took = time.monotonic() - started
        await sql("COMMIT")
        await holder.execute("ROLLBACK")
    answer = {
        "timed_out": timed_out,
        "within_5s": took < 5,
        "jobs": (await sql(f"SELECT count(*) FROM {schema}.jobs"))[0][0],
        "requests": (await sql(f"SELECT count(*) FROM {schema}.requests"))[0][0],
    }
    await conn.close()
    await holder.close()
    return answer


async def many_in_one(kind: str, target: str, count: int) -> dict[str, int]:
    """``count`` enqueues in one transaction on a caller's ``kind`` connection: how deep the
    session's memory contexts go and how many locks it holds at the end, and the jobs
    committed."""
    url, schema = target.rsplit("#", 1)
    conn, sql = await _postgres_client(kind, url)
    async with jobs_trio.aio.Producer(url, schema=schema) as producer:
        await sql("BEGIN")
        for i in range(count):
            await fastapi_style_signup(producer, f"m{i}@x", conn)
        # Each savepoint left open nests in the one before (its memory context a level down)
        # and keeps a lock of its own in the server's shared lock table.
        [[depth]] = await sql("SELECT max(level) FROM pg_backend_memory_contexts")
        [[locks]] = await sql("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()")
        await sql("COMMIT")
        [[jobs]] = await sql(f"SELECT count(*) FROM {schema}.jobs")
    await conn.close()
    return {"depth": depth, "locks": locks, "jobs": jobs}


async def own_write_timed_out(path: str) -> dict[str, Any]:
    """A producer's own write (no connection=) that waits for the file's write lock, which
    another connection holds for 1 s, under a 0.3 s timeout: whether it timed out, and the jobs
    in the file once the lock is let go."""
    async with jobs_trio.aio.Producer(f"sqlite:///{path}") as producer:
        await producer.enqueue(welcome, {"to": "first@x"})  # the file checked, once
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN IMMEDIATE")
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, blocker.execute, "ROLLBACK")
        try:
            await asyncio.wait_for(producer.enqueue(welcome, {"to": "late@x"}), 0.3)
            timed_out = False
        except TimeoutError:
            timed_out = True
        await asyncio.sleep(1.5)  # the lock let go, and any write still under way done
        blocker.close()
    with contextlib.closing(sqlite3.connect(path)) as reader:
        jobs = reader.execute("SELECT count(*) FROM jobs").fetchone()[0]
    return {"timed_out": timed_out, "jobs": jobs}


# The modes that print one JSON answer: the coroutine, and how each of its arguments is read.
_ANSWERS: dict[str, tuple[Callable[..., Awaitable[Any]], tuple[Callable[[str], Any], ...]]] = {
    "mid-statement": (cancelled_mid_statement, (str,)),
    "gathered": (gathered, (str, str, int)),
    "lock-waited": (lock_waited, (str, str, str)),
    "many-in-one": (many_in_one, (str, str, int)),
    "own-write-timed-out": (own_write_timed_out, (str,)),
    "large-timed-out": (large_timed_out, (str,)),
    "timed-out": (timed_out_then_committed, (str, str, int)),
}


def main(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "aio-handlers":
        sqlite_path, pg_url, schema = rest
        print(json.dumps(asyncio.run(aio_handlers(sqlite_path, pg_url, schema))), flush=True)
    elif mode == "hold":
        folder, pg_url, schema = rest
        kept: list[Any] = []  # every connection stays open, and its transaction with it
        hold_sync(Path(folder), pg_url, schema, kept)
        asyncio.run(hold_aio(Path(folder), pg_url, schema, kept))
    elif mode == "cancelled":
        [path] = rest
        asyncio.run(cancelled_then_reused(path))  # which waits for every worker thread
        with sqlite3.connect(path) as conn:
            print(conn.execute("SELECT count(*) FROM jobs").fetchone()[0], flush=True)
    elif mode in _ANSWERS:
        run, reads = _ANSWERS[mode]
        args = [read(text) for read, text in zip(reads, rest, strict=True)]
        print(json.dumps(asyncio.run(run(*args))))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
