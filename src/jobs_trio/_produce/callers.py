# The application's connection a producer writes through (``connection=``): which client it is
# (sqlite3, psycopg, psycopg's async connection, asyncpg; Django's wrapper is unwrapped to the
# one it holds), and whether the caller's transaction is joined or one of its own is made.
# Apart because "inside the caller's own transaction" is decided here for every client.
from __future__ import annotations

import enum
import sqlite3
from typing import Any

from .._core.errors import ConfigError
from ..drivers._sqlite_enqueue import joins_callers as sqlite_joins_callers
from ..drivers._transaction import Transaction


class Client(enum.StrEnum):
    SQLITE = "sqlite3"
    PSYCOPG = "psycopg"
    PSYCOPG_ASYNC = "psycopg (async)"
    ASYNCPG = "asyncpg"


def _module(connection: object) -> str:
    return type(connection).__module__


def client_of(connection: object) -> tuple[Client, Any]:
    """The client ``connection`` belongs to, and the connection to write through."""
    if isinstance(connection, Transaction):
        raise ConfigError(
            "connection= is a jobs_trio.transaction block, which belongs to Trio code",
            fix="in Trio code enqueue with JobDefinition.enqueue inside the block; a producer"
            " takes the application's own connection (sqlite3, psycopg, asyncpg, Django's)",
        )
    if _module(connection).startswith("django.") and hasattr(connection, "ensure_connection"):
        # django.db.connection (or connections[alias]): the DB-API connection it holds, which
        # its transaction.atomic() blocks run on.
        django: Any = connection
        django.ensure_connection()
        connection = django.connection
    if isinstance(connection, sqlite3.Connection):
        return Client.SQLITE, connection
    module = _module(connection)
    if module.startswith("psycopg"):
        import psycopg

        if isinstance(connection, psycopg.Connection):
            return Client.PSYCOPG, connection
        if isinstance(connection, psycopg.AsyncConnection):
            return Client.PSYCOPG_ASYNC, connection
    if module.startswith("asyncpg"):
        if callable(getattr(connection, "acquire", None)):
            raise ConfigError(
                "connection= is an asyncpg pool, not a connection: a pool has no transaction"
                " to join",
                fix="acquire a connection (async with pool.acquire() as conn) and pass it; or"
                " leave connection= out and the producer writes on its own",
            )
        return Client.ASYNCPG, connection
    raise ConfigError(
        f"connection= is a {module}.{type(connection).__name__}, which a producer cannot write"
        " through",
        fix="pass a sqlite3 connection, a psycopg (3) connection, an asyncpg connection or"
        " Django's django.db.connection",
    )


def joins_callers(client: Client, connection: Any) -> bool:
    """Whether the write belongs to a transaction the caller commits (and is made inside a
    savepoint of it), as the caller's own INSERT on this connection would: one it is in, or
    one its DB-API opens before the first statement (sqlite3's default isolation level,
    psycopg's default ``autocommit=False``: Django's atomic() blocks too). Otherwise the
    producer begins and commits a transaction of its own."""
    if client is Client.SQLITE:
        return sqlite_joins_callers(connection)
    if client is Client.ASYNCPG:
        return bool(connection.is_in_transaction())  # asyncpg is in autocommit outside one
    import psycopg

    idle = connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return not (connection.autocommit and idle)


def wrong_client(client: Client, store: str, wanted: str) -> ConfigError:
    """The refusal of a connection of a client that cannot write to ``store`` from here."""
    return ConfigError(
        f"connection= is a {client.value} connection, which cannot write to {store}",
        fix=f"pass {wanted}, or leave connection= out and the producer writes on its own",
    )
