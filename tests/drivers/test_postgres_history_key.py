# The attempt history references no job by a foreign key (migration 0030, issue 44): the key's
# check was a query and a row lock on the job for every attempt a settle recorded.
from __future__ import annotations

from importlib import resources
from typing import Any

import pytest

from tests.conftest import require_postgres

pytestmark = pytest.mark.postgres

pytest.importorskip("trio_asyncio")
pytest.importorskip("asyncpg")

from jobs_trio.drivers.postgres import open_postgres_driver  # noqa: E402

MIGRATION = "0030_attempts_unreferenced.sql"

KEYS = """SELECT conname FROM pg_constraint
WHERE conrelid = '"{schema}".attempts'::regclass AND contype = 'f'"""


async def test_the_history_has_no_key_to_jobs_whatever_the_name_it_was_made_with(
    pg_schema: str,
) -> None:
    sql = (resources.files("jobs_trio.drivers.postgres_migrations") / MIGRATION).read_text()
    async with open_postgres_driver(
        require_postgres(), schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        schema = driver.schema
        keys = KEYS.format(schema=schema)

        async def check(conn: Any) -> tuple[list[str], list[str]]:
            migrated = [row[0] for row in await conn.fetch(keys)]
            # One made again by hand under a name of its own goes too.
            await conn.execute(
                f'ALTER TABLE "{schema}".attempts ADD CONSTRAINT made_by_hand'
                f' FOREIGN KEY (job_id) REFERENCES "{schema}".jobs (id) ON DELETE CASCADE'
            )
            await conn.execute(sql.replace("{schema}", f'"{schema}"'))
            return migrated, [row[0] for row in await conn.fetch(keys)]

        migrated, again = await driver.bridge.run(check, what="reading the history's keys")
    assert (migrated, again) == ([], [])
