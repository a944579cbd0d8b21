# Opening the crossing into asyncpg: the trio-asyncio loop (the caller's, else one of its own)
# and the bridge's pool on it. Apart from _postgres_bridge.py, which runs operations once open.
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from .._core.errors import ConfigError
from .._core.logs import log_event
from ._postgres_bridge import Bridge, NameHolders
from ._postgres_pool import Connection, session_settings
from ._postgres_pooler import Pooler


@contextlib.asynccontextmanager
async def open_bridge(
    url: str,
    *,
    loop: Any = None,
    pool_size: int,
    application_name: str,
    session: Mapping[str, str] | None = None,
    pooler: Pooler | None = None,
    name_holders: NameHolders | None = None,
) -> AsyncIterator[Bridge]:
    """A bridge on ``loop``, else on the trio-asyncio loop the caller already runs in, else on
    a loop of its own for as long as the bridge is open."""
    # Imported here, never at module level: importing trio_asyncio changes asyncio for the
    # whole process (STACK-NOTES), and only applications that use PostgreSQL should pay that.
    import trio_asyncio

    if not isinstance(pool_size, int) or pool_size < 1:
        raise ConfigError(
            f"pool_size must be a positive whole number, not {pool_size!r}",
            fix="pass pool_size=10 (or the number of operations you run at once)",
        )
    if session is None:
        session = session_settings(url)
    if loop is None:
        loop = trio_asyncio.current_loop.get()
    if loop is not None:
        async with _open_pool(
            url, loop, pool_size, application_name, session, pooler, name_holders
        ) as bridge:
            yield bridge
        return
    async with trio_asyncio.open_loop() as own_loop:
        # trio-asyncio's own handler raises whatever asyncio reports into the loop's nursery:
        # a future nobody awaited (asyncpg's TLS upgrade, its connect given up while a killed
        # connection closed) then ended the worker, X_UNEXPECTED, exit 2, with no job at fault.
        own_loop.set_exception_handler(_report_loop_error)
        async with _open_pool(
            url, own_loop, pool_size, application_name, session, pooler, name_holders
        ) as b:
            yield b


def _report_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """What asyncio reports on our own loop outside any operation (every operation's own
    errors reach its caller): said, never raised."""
    exc = context.get("exception")
    log_event(
        "jobs.driver.loop-error",
        logging.WARNING,
        message=str(context.get("message", "")),
        error=f"{type(exc).__name__}: {exc}" if exc is not None else None,
        why="asyncio reported an error no operation was waiting for (a connection given up"
        " mid-connect, a future nobody read); no operation failed because of it",
    )


@contextlib.asynccontextmanager
async def _open_pool(
    url: str,
    loop: Any,
    pool_size: int,
    application_name: str,
    session: Mapping[str, str],
    pooler: Pooler | None,
    name_holders: NameHolders | None,
) -> AsyncIterator[Bridge]:
    bridge = Bridge(url, loop, pool_size, application_name, session, pooler, name_holders)
    try:
        # One connection now, so a server that cannot be reached fails the open, not the
        # first operation.
        await bridge.run(_nothing, what="opening the driver")
        yield bridge
    finally:
        await bridge.aclose()


async def _nothing(conn: Connection) -> None:
    pass
