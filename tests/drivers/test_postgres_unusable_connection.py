# The PostgreSQL bridge turns asyncpg's InternalClientError (a connection whose protocol is stuck)
# into a retryable DriverError and drops that connection. Apart from test_postgres_driver.py as
# the regression test for what test_processes_postgres.py's connection-kill test found: a killed
# IDLE pool connection failed the next statement with "cannot switch to state 12; another
# operation (2) is in progress", which escaped untranslated and crashed the worker process.
from __future__ import annotations

from typing import Any

import pytest

from jobs_trio._core.errors import DriverError

pytestmark = pytest.mark.postgres

asyncpg = pytest.importorskip("asyncpg")

from jobs_trio.drivers.postgres import open_postgres_driver  # noqa: E402


async def test_a_stuck_connection_is_a_retryable_driver_error_and_is_replaced(
    postgres_url: str, pg_schema: str
) -> None:
    async with open_postgres_driver(
        postgres_url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=1
    ) as driver:

        async def backend(conn: Any) -> int:
            pid: int = await conn.fetchval("SELECT pg_backend_pid()")
            return pid

        before = await driver.bridge.run(backend, what="pid")

        async def stuck(conn: Any) -> None:
            # What asyncpg raises from the statement after the server's "terminating
            # connection" reached an idle connection whose close it has not read yet; the
            # real race is what the connection-kill process test hits.
            raise asyncpg.InternalClientError(
                "cannot switch to state 12; another operation (2) is in progress"
            )

        with pytest.raises(DriverError) as caught:
            await driver.bridge.run(stuck, what="claim")
        assert caught.value.retryable and caught.value.fix
        assert "became unusable during claim" in caught.value.cause
        # The one pooled connection was dropped, not handed to the next operation.
        assert await driver.bridge.run(backend, what="pid") != before
