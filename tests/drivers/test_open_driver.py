# open_driver and migrate_database: the one place a URL picks its driver and that driver's
# migrate; an option the driver does not take is refused before anything is opened.
from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from jobs_trio._core.errors import ConfigError
from jobs_trio.drivers._open_driver import DriverKind, driver_kind, migrate_database, open_driver
from jobs_trio.drivers._sqlite_migrate import KNOWN, FileKind, identify
from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.drivers.sqlite import SqliteDriver, open_sqlite_driver


def keywords(function: Callable[..., object]) -> set[str]:
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


def test_open_driver_takes_every_option_of_every_driver_and_no_other() -> None:
    # Its keywords are what a type checker sees: a driver option missing here could only be
    # passed through **options, and one here that no driver takes is a typo's twin.
    postgres = pytest.importorskip("jobs_trio.drivers.postgres")
    drivers = (
        keywords(MemoryDriver.__init__) - {"url"}  # the URL itself, given apart
        | keywords(open_sqlite_driver)
        | keywords(postgres.open_postgres_driver)
    )
    assert keywords(open_driver) == drivers


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory://", DriverKind.MEMORY),
        ("sqlite:///jobs.db", DriverKind.SQLITE),
        ("postgresql://u@h/db", DriverKind.POSTGRES),
        ("postgres://u@h/db", DriverKind.POSTGRES),
    ],
)
def test_a_url_names_its_driver(url: str, kind: DriverKind) -> None:
    assert driver_kind(url) is kind


async def test_an_option_the_driver_does_not_take_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with pytest.raises(ConfigError) as refused:
        async with open_driver(f"sqlite:///{path}", schema="other", pool_size=2):
            pass
    assert "does not take pool_size=, schema=" in refused.value.cause
    assert "busy_timeout=" in refused.value.fix  # what it does take
    assert not path.exists()  # refused before the file was touched
    with pytest.raises(ConfigError, match="does not take busy_timeout="):
        async with open_driver("memory://", busy_timeout=1.0):
            pass


async def test_options_reach_the_driver(tmp_path: Path) -> None:
    async with open_driver(f"sqlite:///{tmp_path / 'jobs.db'}", clock=lambda: 42.0) as driver:
        assert isinstance(driver, SqliteDriver) and driver.now() == 42.0
    async with open_driver("memory://", clock=lambda: 7.0) as driver:
        assert isinstance(driver, MemoryDriver) and driver.now() == 7.0


async def test_migrate_is_taken_by_every_driver(tmp_path: Path) -> None:
    # An application that picks its database from a URL passes one set of options: migrate=True
    # on SQLite (which migrates on every open to write) and memory is not an error.
    path = tmp_path / "jobs.db"
    async with open_driver(f"sqlite:///{path}", migrate=True) as driver:
        assert isinstance(driver, SqliteDriver)
    assert identify(str(path)).kind is FileKind.JOBS_TRIO
    async with open_driver("memory://", migrate=True) as driver:
        assert isinstance(driver, MemoryDriver)
    with pytest.raises(ConfigError, match="read-only open never migrates"):
        async with open_driver(f"sqlite:///{path}", migrate=True, read_only=True):
            pass


async def test_migrate_database_on_sqlite_makes_the_file_a_current_jobs_trio_database(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    assert identify(str(path)).kind is FileKind.MISSING
    applied = await migrate_database(f"sqlite:///{path}")  # migrated by the open itself
    assert applied == [m.version for m in KNOWN]
    identity = identify(str(path))
    assert identity.kind is FileKind.JOBS_TRIO and identity.schema_version == applied[-1]
    assert await migrate_database(f"sqlite:///{path}") == []
    with pytest.raises(ConfigError, match="does not take schema="):
        await migrate_database(f"sqlite:///{path}", schema="other")
    assert await migrate_database("memory://") is None
