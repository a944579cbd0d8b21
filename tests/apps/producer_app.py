# The applications of tests/produce/: a Flask-style handler (blocking) and a FastAPI-style one
# (asyncio) that enqueue a welcome job, a process that holds every kind of caller's transaction
# open after its enqueue until it is SIGKILLed, and one whose enqueue is cancelled. Apart
# because an asyncio application runs on a plain asyncio loop in a process of its own, never
# beside trio-asyncio.
from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import sys
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
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
