# Fixtures shared by every test: a manual clock for drivers, and the PostgreSQL gate.
# PostgreSQL tests skip with a reason where no server answers, and FAIL under CI=true.
from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

import jobs_trio
from jobs_trio.testing import ManualClock
from tests.helpers.skip_reasons import pytest_runtest_makereport  # noqa: F401 (a hook)

POSTGRES_URL = os.environ.get("JOBS_TRIO_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(autouse=True)
def root_logger_as_it_was() -> Iterator[None]:
    """A command run in-process (`main(["worker", ...])`) configures logging as a process would:
    the next test gets the root logger back as it was, level and handlers."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


def _postgres_reachable() -> str | None:
    """None when a server answers on the test URL's host and port, else why not."""
    from urllib.parse import urlparse

    parsed = urlparse(POSTGRES_URL)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 5432
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"no PostgreSQL at {host}:{port} ({exc}); set JOBS_TRIO_TEST_PG to a server's URL"


def require_postgres() -> str:
    """The test PostgreSQL URL, or a skip (a failure under CI=true, where it must be there)."""
    why = _postgres_reachable()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but PostgreSQL is unreachable: {why}")
        pytest.skip(why)
    return POSTGRES_URL


@pytest.fixture
def postgres_url() -> str:
    return require_postgres()


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name per test; dropped afterwards by the driver tests that create it."""
    yield f"jt_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def pg_driver(postgres_url: str, pg_schema: str) -> AsyncIterator[jobs_trio.Driver]:
    """A PostgreSQL driver on ``pg_schema``, migrated, the schema dropped at its close."""
    async with jobs_trio.open_driver(
        postgres_url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        yield driver


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests (processes, browsers, a million jobs) first: `nox -s tests` runs on four
    workers, and one started last would be the whole suite's tail. A stable sort: the order
    within each kind is the files' own."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
