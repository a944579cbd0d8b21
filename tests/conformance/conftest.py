# The conformance suite's one fixture: an open driver of each kind, on a manual clock.
# Every test in this folder runs against memory, SQLite and PostgreSQL unchanged.
from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from jobs_trio.driver import Driver
from jobs_trio.open_driver import open_driver
from tests.conftest import ManualClock, require_postgres

DRIVERS = ["memory", "sqlite", "postgres"]


def _available(kind: str) -> bool:
    module = {"memory": "memory", "sqlite": "sqlite", "postgres": "postgres"}[kind]
    return importlib.util.find_spec(f"jobs_trio.drivers.{module}") is not None


@pytest.fixture(params=DRIVERS)
async def driver(
    request: pytest.FixtureRequest, manual_clock: ManualClock, tmp_path: Path, pg_schema: str
) -> AsyncIterator[Driver]:
    kind = request.param
    if not _available(kind):
        pytest.skip(f"the {kind} driver is not built yet")
    if kind == "memory":
        url, options = "memory://", {}
    elif kind == "sqlite":
        url, options = f"sqlite:///{tmp_path / 'jobs.db'}", {}
    else:
        url = require_postgres()
        options = {"schema": pg_schema, "migrate": True, "drop_schema_on_close": True}
    async with open_driver(url, clock=manual_clock, **options) as opened:
        yield opened
