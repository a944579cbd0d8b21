# `open_driver(url)` and `migrate_database(url)`: the one place a database URL is mapped to its
# driver and to that driver's migrate. Apart so that a driver module (and its imports:
# trio-asyncio, asyncpg) loads only when a URL names it.
from __future__ import annotations

import contextlib
import enum
import importlib.util
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn, TypedDict
from urllib.parse import urlsplit

from .._core.errors import ConfigError
from .._core.redaction import redact_url
from .contract import Driver

SCHEMES = ("memory://", "sqlite:///", "postgresql://", "postgres://")
POSTGRES_EXTRA = "pip install 'jobs-trio[postgres]'"
# What a PostgreSQL URL needs installed (the `postgres` extra), by import name.
POSTGRES_PACKAGES = ("asyncpg", "trio_asyncio")

Opener = Callable[..., contextlib.AbstractAsyncContextManager[Driver]]
Migrate = Callable[..., Awaitable[list[int] | None]]


class DriverOptions(TypedDict, total=False):
    """``open_driver``'s options as one typed value (``open_driver(url, **options)``): names
    and types as ``open_driver`` declares them (tests/typecheck holds them equal)."""

    clock: Callable[[], float] | None
    migrate: bool | None
    busy_timeout: float | None
    poll_interval: float | None
    synchronous: str | None
    read_only: bool | None
    create: bool | None
    schema: str | None
    pool_size: int | None
    loop: Any
    drop_schema_on_close: bool | None
    statement_timeout: float | None
    lock_timeout: float | None
    pgbouncer: str | None
    listen_url: str | None


class DriverKind(enum.StrEnum):
    MEMORY = "memory"
    SQLITE = "sqlite"
    POSTGRES = "postgresql"


def driver_kind(url: str) -> DriverKind:
    """Which driver ``url`` is for; a `ConfigError` (the URL's password masked) for a URL no
    driver reads. The URL itself is checked by the driver when it opens."""
    if not isinstance(url, str) or not url:
        raise ConfigError(
            "no database URL was given",
            fix="pass --db URL or set JOBS_TRIO_DB (e.g. sqlite:///jobs.db)",
        )
    if url.startswith("memory://"):
        return DriverKind.MEMORY
    if url.startswith("sqlite://"):
        return DriverKind.SQLITE
    if url.startswith(("postgresql://", "postgres://")):
        return DriverKind.POSTGRES
    scheme = url.partition("://")[0]
    if scheme.startswith(("postgresql+", "postgres+")):
        # SQLAlchemy's way of naming a driver; asyncpg reads only the plain scheme.
        _refuse(url, fix=f"write it as postgresql://{url.partition('://')[2]}")
    _refuse(url, fix="use one of " + ", ".join(SCHEMES) + " (e.g. sqlite:///jobs.db)")


@contextlib.asynccontextmanager
async def open_driver(
    url: str,
    *,
    # Every driver.
    clock: Callable[[], float] | None = None,
    migrate: bool | None = None,
    # SQLite (drivers/sqlite.py, open_sqlite_driver).
    busy_timeout: float | None = None,
    poll_interval: float | None = None,
    synchronous: str | None = None,
    read_only: bool | None = None,
    create: bool | None = None,
    # PostgreSQL (drivers/postgres.py, open_postgres_driver).
    schema: str | None = None,
    pool_size: int | None = None,
    loop: Any = None,
    drop_schema_on_close: bool | None = None,
    statement_timeout: float | None = None,
    lock_timeout: float | None = None,
    pgbouncer: str | None = None,
    listen_url: str | None = None,
) -> AsyncIterator[Driver]:
    """``memory://``, ``sqlite:///path/to/jobs.db`` or ``postgresql://user@host/db``.

    Every option belongs to one driver or more (its opener documents it); None leaves that
    driver's default. ``clock`` and ``migrate`` every driver takes (``migrate=True`` applies
    PostgreSQL's migrations; SQLite migrates whenever it opens to write, memory has nothing to
    migrate). An option the URL's driver does not take is a `ConfigError`, not ignored:
    ``schema=`` on a SQLite URL would point at jobs that are not there. ``DriverOptions`` is
    the same options as one typed value, for an application that builds them apart.
    """
    # Only the parameters are bound at this point: the options, as given, by name.
    given = {name: value for name, value in locals().items() if name != "url"}
    kind = driver_kind(url)
    check_url(kind, url)
    opener, _ = _driver(kind)
    async with opener(url, **_taken(opener, url, given)) as driver:
        yield driver


async def migrate_database(
    url: str,
    *,
    schema: str | None = None,
    lock_timeout: float | None = None,
    wait: float | None = None,
) -> list[int] | None:
    """Bring the database ``url`` names up to this release's schema, and answer the versions
    this call applied. PostgreSQL applies its numbered migrations one transaction each, under an
    advisory lock, each lock waited for ``lock_timeout`` seconds at most and tried again later
    for up to ``wait`` seconds in all (PostgreSQL only). SQLite is created and upgraded whenever
    it is opened to write, so this is that open. memory:// has no schema to migrate: None."""
    kind = driver_kind(url)
    check_url(kind, url)
    _, migrate = _driver(kind)
    given = {"schema": schema, "lock_timeout": lock_timeout, "wait": wait}
    return await migrate(url, **_taken(migrate, url, given))


def _driver(kind: DriverKind) -> tuple[Opener, Migrate]:
    """The driver's opener and its migrate, imported only now: a URL of another kind never
    loads this driver's module (nor asyncpg and trio-asyncio)."""
    if kind is DriverKind.MEMORY:
        return _open_memory, _migrate_memory
    if kind is DriverKind.SQLITE:
        from ._sqlite_migrate import migrate as migrate_sqlite
        from .sqlite import open_sqlite_driver

        return open_sqlite_driver, migrate_sqlite
    _require_postgres_packages()
    from ._postgres_migrate import migrate as migrate_postgres
    from .postgres import open_postgres_driver

    return open_postgres_driver, migrate_postgres


def check_url(kind: DriverKind, url: str) -> None:
    """Refuse a PostgreSQL URL that does not parse (an unclosed ``[`` of an IPv6 host, a port
    that is not a number) as the user's mistake it is. Read later, by the pooler or asyncpg,
    its ValueError reached the CLI as "unexpected ... a bug in jobs_trio"."""
    if kind is not DriverKind.POSTGRES:
        return
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (reading it checks it: a port must be a number up to 65535)
    except ValueError as exc:
        raise ConfigError(
            f"the database URL {redact_url(url)!r} is malformed: {exc}",
            fix="write it as postgresql://USER:PASSWORD@HOST:PORT/DATABASE; put an IPv6 host in"
            " brackets ([::1]) and percent-encode a password's special characters (@ is %40,"
            " / is %2F, [ is %5B)",
        ) from None


def _require_postgres_packages() -> None:
    """The ``postgres`` extra, looked for without importing it (importing trio-asyncio changes
    asyncio for the whole process). Missing, the first query failed as X_UNEXPECTED."""
    missing = [name for name in POSTGRES_PACKAGES if not _installed(name)]
    if missing:
        raise ConfigError(
            "PostgreSQL URLs need packages that are not installed (" + ", ".join(missing) + ")",
            fix=POSTGRES_EXTRA,
        )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent that fails to import; a module set to None
        return False


def _taken(
    function: Callable[..., object], url: str, given: Mapping[str, object]
) -> dict[str, Any]:
    """The options given (not None) that ``function`` takes, each by its keyword; a
    `ConfigError` naming any it does not take. Read off its signature, so a driver's options
    are listed once, where the driver declares them."""
    takes = {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    options = {name: value for name, value in given.items() if value is not None}
    refused = sorted(set(options) - takes)
    if refused:
        kind = driver_kind(url)
        raise ConfigError(
            f"the {kind} driver does not take "
            + ", ".join(f"{name}=" for name in refused)
            + f" (given for {redact_url(url)!r})",
            fix=f"drop {', '.join(refused)}; a {kind} URL takes "
            + (", ".join(f"{name}=" for name in sorted(takes)) or "no options"),
        )
    return options


def _refuse(url: str, *, fix: str) -> NoReturn:
    # The URL may carry a password, and this message reaches terminals and logs.
    raise ConfigError(f"unsupported database URL {redact_url(url)!r}", fix=redact_url(fix))


@contextlib.asynccontextmanager
async def _open_memory(
    url: str, *, clock: Callable[[], float] = time.time, migrate: bool = False
) -> AsyncIterator[Driver]:
    # migrate=: nothing to do (a memory store begins empty, at this release's "schema"); taken
    # so that one set of options serves every URL.
    from .memory import MemoryDriver

    driver = MemoryDriver(url=url, clock=clock)
    try:
        yield driver
    finally:
        await driver.aclose()


async def _migrate_memory(url: str) -> None:
    return None  # a memory store begins empty with every open: there is no schema to bring up
