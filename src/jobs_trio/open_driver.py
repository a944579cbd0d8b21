# `open_driver(url)`: turns a database URL into an open driver, and closes it on the way out.
# Apart so that a driver module (and its imports: trio-asyncio, asyncpg) loads only when used.
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

from .driver import Driver
from .errors import ConfigError
from .redaction import redact_url

SCHEMES = ("memory://", "sqlite:///", "postgresql://", "postgres://")


@contextlib.asynccontextmanager
async def open_driver(url: str, **options: Any) -> AsyncIterator[Driver]:
    """``memory://``, ``sqlite:///path/to/jobs.db`` or ``postgresql://user@host/db``."""
    opener = _opener_for(url)
    async with opener(url, **options) as driver:
        yield driver


def _opener_for(url: str) -> Callable[..., contextlib.AbstractAsyncContextManager[Driver]]:
    if not isinstance(url, str) or not url:
        raise ConfigError(
            "no database URL was given",
            fix="pass --db URL or set JOBS_TRIO_DB (e.g. sqlite:///jobs.db)",
        )
    if url.startswith("memory://"):
        return _open_memory
    if url.startswith("sqlite://"):
        from .drivers.sqlite import open_sqlite_driver

        return open_sqlite_driver
    if url.startswith(("postgresql://", "postgres://")):
        from .drivers.postgres import open_postgres_driver

        return open_postgres_driver
    scheme = url.partition("://")[0]
    if scheme.startswith(("postgresql+", "postgres+")):
        # SQLAlchemy's way of naming a driver; asyncpg reads only the plain scheme.
        return _refuse(url, fix=f"write it as postgresql://{url.partition('://')[2]}")
    return _refuse(url, fix="use one of " + ", ".join(SCHEMES) + " (e.g. sqlite:///jobs.db)")


def _refuse(url: str, *, fix: str) -> NoReturn:
    # The URL may carry a password, and this message reaches terminals and logs.
    raise ConfigError(f"unsupported database URL {redact_url(url)!r}", fix=redact_url(fix))


@contextlib.asynccontextmanager
async def _open_memory(url: str, **options: Any) -> AsyncIterator[Driver]:
    from .drivers.memory import MemoryDriver

    driver = MemoryDriver(url=url, **options)
    try:
        yield driver
    finally:
        await driver.aclose()
