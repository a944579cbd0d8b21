# Where a producer writes, from the URL a driver would be opened with: a SQLite file (checked to
# be a jobs_trio database) or a PostgreSQL schema (its statements, and how to connect to it with
# psycopg or asyncpg: the driver's own URL options and timeouts). Apart because both producers
# read a URL the same way the drivers do.
from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs

from .._core.errors import ConfigError
from .._core.redaction import redact_url
from ..drivers._postgres_pool import session_settings
from ..drivers._postgres_pooler import DIRECT, SESSION, TRANSACTION, Pooler
from ..drivers._postgres_sql import Statements, load_statements
from ..drivers._sqlite_migrate import (
    FileKind,
    check_busy_timeout,
    check_readable,
    identify,
    open_beside,
    sqlite_path,
)

_TIMEOUTS = ("statement_timeout", "lock_timeout")
# Read by the driver's pool, not sent by a producer (its transactions are single writes of its
# own): taken out of the URL, where psycopg refused it as a query parameter it does not know.
_NOT_SENT = (*_TIMEOUTS, "idle_in_transaction_session_timeout")


@attrs.frozen
class SqliteStore:
    """A jobs_trio SQLite file, written through connections of the producer's own (one a call)
    or the application's."""

    path: str
    busy_timeout: float

    def check(self) -> None:
        """Refuse a file that is not a jobs_trio database at this release's schema: a producer
        never creates or migrates one (a worker, or `jobs-trio migrate`, does)."""
        found = identify(self.path)
        if found.kind in (FileKind.MISSING, FileKind.NEW):
            fix = f"run `jobs-trio migrate --db sqlite:///{self.path}` (or start a worker) first"
        else:
            # Another application's file, or not SQLite's: migrate refuses it too, and said to
            # run it sent the reader round in a circle.
            fix = "point the URL at the jobs_trio database the workers use; this file was left"
            " untouched"
        if found.kind is not FileKind.JOBS_TRIO:
            raise ConfigError(
                f"{self.path!r} is not a jobs_trio database ({found.kind.value})", fix=fix
            )
        # Behind this release, or at a compatibility level it does not work with: refused
        # with the driver's own words (a newer release's additive migrations are fine).
        check_readable(self.path)

    def connect(self) -> sqlite3.Connection:
        """A connection of the producer's own, to the file checked as it opens (``check``):
        after the file was replaced, the call that noticed it was checked and the next wrote
        unchecked to whatever had come in. SQLite's busy handler waits out a worker that holds
        the write lock, up to ``busy_timeout``."""
        self.check()
        return open_beside(self.path, self.busy_timeout)


@attrs.frozen
class PostgresStore:
    """A migrated jobs_trio schema on a PostgreSQL server."""

    url: str  # as given (shown redacted)
    sql: Statements
    pooler: Pooler
    timeouts: Mapping[str, str]  # statement_timeout, lock_timeout as the driver sets them

    @property
    def shown(self) -> str:
        return redact_url(self.url)

    def psycopg_options(self) -> dict[str, Any]:
        """psycopg.connect's arguments: libpq takes no query option it does not know, so the
        driver's own (pgbouncer, listen_*, the timeouts) are taken out of the URL and the
        timeouts sent as startup options, as the driver's connections get them."""
        parts = urlsplit(self.pooler.url)
        kept = [(k, v) for k, v in parse_qsl(parts.query) if k not in _NOT_SENT]
        options: dict[str, Any] = {
            "conninfo": urlunsplit(parts._replace(query=urlencode(kept))),
            "application_name": f"jobs_trio:{self.sql.schema}:producer",
        }
        if self.pooler.mode == DIRECT:
            options["options"] = " ".join(f"-c {k}={v}" for k, v in self.timeouts.items())
        if self.pooler.mode == TRANSACTION:
            # psycopg prepares a statement from its fifth use, on the server connection of that
            # moment: in transaction mode the next transaction may be another's, and a write in
            # seven failed ("prepared statement _pg3_... does not exist / already exists").
            options["prepare_threshold"] = None
        return options

    def session_sets(self) -> str | None:
        """What a new connection runs first: PgBouncer in session mode refuses the timeouts as
        startup options; in transaction mode no session setting holds (put them on the role)."""
        if self.pooler.mode != SESSION:
            return None
        return "; ".join(f"SET {k} = '{v}'" for k, v in self.timeouts.items())

    def asyncpg_options(self) -> dict[str, Any]:
        """asyncpg.connect's (or create_pool's) arguments, as the driver's pool opens with."""
        settings: dict[str, str] = {"application_name": f"jobs_trio:{self.sql.schema}:producer"}
        if self.pooler.mode == DIRECT:
            settings.update(self.timeouts)
        options: dict[str, Any] = {"dsn": self.pooler.url, "server_settings": settings}
        if self.pooler.mode != DIRECT and self.pooler.mode != SESSION:
            options["statement_cache_size"] = 0  # PgBouncer in transaction mode
        return options


Store = SqliteStore | PostgresStore


def store_for(url: str, *, schema: str, busy_timeout: float) -> Store:
    """What ``url`` names, read as ``jobs_trio.open_driver`` reads it."""
    if not isinstance(url, str):
        raise ConfigError(f"url={url!r} is not a str", fix="pass the URL the workers use")
    if url.startswith("sqlite:"):
        return SqliteStore(sqlite_path(url), check_busy_timeout(busy_timeout))
    if url.startswith(("postgresql://", "postgres://")):
        timeouts = {k: v for k, v in session_settings(url).items() if k in _TIMEOUTS}
        return PostgresStore(url, load_statements(schema), Pooler.of(url), timeouts)
    if url.startswith("memory:"):
        raise ConfigError(
            "a memory:// store lives inside one Trio process; a producer cannot reach it",
            fix="give the producer the SQLite or PostgreSQL URL the workers use; in a test,"
            " enqueue with JobDefinition.enqueue on the memory driver",
        )
    raise ConfigError(
        f"{redact_url(url)!r} is not a URL a producer can write to",
        fix="use sqlite:///path/jobs.db or postgresql://user@host/db",
    )
