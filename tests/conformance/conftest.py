# The one fixture the packaged conformance suite asks for: a factory of fresh drivers, here of
# each of the three kinds, so every test of the suite runs against memory, SQLite and PostgreSQL.
from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.testing.conformance import DriverFactory
from tests.conftest import require_postgres
from tests.helpers.pg_schemas import SchemaPool

# PostgreSQL's runs are marked, so the quick lane (`-m "not slow and not postgres"`) leaves them
# out; the full suite runs all three.
DRIVERS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def pg_schema_pool() -> Iterator[SchemaPool]:
    """Migrated schemas this test process reuses (emptied at each open): a migration costs
    more than most conformance tests."""
    from tests.conftest import POSTGRES_URL

    pool = SchemaPool(POSTGRES_URL)
    yield pool
    pool.drop_all()


@pytest.fixture(params=DRIVERS)
def driver_factory(
    request: pytest.FixtureRequest, tmp_path: Path, pg_schema_pool: SchemaPool
) -> DriverFactory:
    kind = request.param
    if kind == "memory":
        return lambda clock: open_driver("memory://", clock=clock)
    if kind == "sqlite":
        files = itertools.count()
        return lambda clock: open_driver(
            f"sqlite:///{tmp_path / f'jobs-{next(files)}.db'}", clock=clock
        )
    require_postgres()
    return pg_schema_pool.open
