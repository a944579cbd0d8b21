# The one fixture the packaged conformance suite asks for: a factory of fresh drivers, here of
# each of the three kinds, so every test of the suite runs against memory, SQLite and PostgreSQL.
from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.testing.conformance import DriverFactory
from tests.conftest import require_postgres

# PostgreSQL's runs are marked, so the quick lane (`-m "not slow and not postgres"`) leaves them
# out; the full suite runs all three.
DRIVERS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=DRIVERS)
def driver_factory(request: pytest.FixtureRequest, tmp_path: Path) -> DriverFactory:
    kind = request.param
    if kind == "memory":
        return lambda clock: open_driver("memory://", clock=clock)
    if kind == "sqlite":
        files = itertools.count()
        return lambda clock: open_driver(
            f"sqlite:///{tmp_path / f'jobs-{next(files)}.db'}", clock=clock
        )
    url = require_postgres()

    def open_postgres(clock: Callable[[], float]) -> AbstractAsyncContextManager[Driver]:
        schema = f"jt_{uuid.uuid4().hex[:12]}"
        return open_driver(url, clock=clock, schema=schema, migrate=True, drop_schema_on_close=True)

    return open_postgres
