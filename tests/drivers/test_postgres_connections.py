# A server with no connection slot left (max_connections, or a CONNECTION LIMIT) is named as
# such, with the fix, rather than reported as a lost connection (issue 20).
from __future__ import annotations

import uuid
from urllib.parse import urlparse

import pytest

from jobs_trio._core.errors import DriverError
from jobs_trio.drivers._open_driver import open_driver
from tests.drivers.test_postgres_driver import open_admin

pytestmark = pytest.mark.postgres

pytest.importorskip("trio_asyncio")


async def test_no_connection_slot_left_is_named_with_its_fix(postgres_url: str) -> None:
    role = f"jt_full_{uuid.uuid4().hex[:10]}"
    async with open_admin(postgres_url) as admin:
        # A role with no connection slot: PostgreSQL answers 53300, as at max_connections.
        await admin.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0')
        try:
            url = (
                urlparse(postgres_url)
                ._replace(netloc=f"{role}@{urlparse(postgres_url).netloc.split('@')[-1]}")
                .geturl()
            )
            with pytest.raises(DriverError) as refused:
                async with open_driver(url):
                    pass
        finally:
            await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    assert "no connection slot left" in str(refused.value)
    assert "pool_size" in refused.value.fix and "max_connections" in refused.value.fix
