# jobs_trio's pytest plugin, loaded by pytest wherever jobs_trio is installed (entry point
# pytest11): the fixtures an application's job tests start from, so that such a test is three
# lines. Apart because it is pytest's side of the test kit; it imports nothing until used.
"""Fixtures for testing an application's jobs (pytest-trio's ``trio_mode``):

* ``jobs_registry`` — the application's ``Registry``: set ``jobs_trio_registry =
  "myapp.jobs:registry"`` in the pytest ini options, or override the fixture.
* ``memory_driver`` — a fresh memory driver on Trio's clock. Take pytest-trio's
  ``autojump_clock`` in the test too, and delays, backoffs and ``step.sleep`` take no time
  (pytest-trio runs a test on a clock only the test itself asks for).
* ``jobs_worker`` — a test worker (``jobs_trio.testing.new_worker``) of ``jobs_registry`` on
  ``memory_driver``: ``await run_until_idle(jobs_worker)`` runs what is due.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "jobs_trio_registry",
        "the application's jobs_trio Registry, as MODULE:ATTRIBUTE (the jobs_registry fixture)",
        default="",
    )


@pytest.fixture
def jobs_registry(request: pytest.FixtureRequest) -> Any:
    """The application's Registry, named by the ``jobs_trio_registry`` ini option."""
    where = str(request.config.getini("jobs_trio_registry"))
    if not where:
        pytest.fail(
            "the jobs_registry fixture needs the application's registry: set"
            ' jobs_trio_registry = "myapp.jobs:registry" under [tool.pytest.ini_options],'
            " or define a jobs_registry fixture in conftest.py",
            pytrace=False,
        )
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute or "registry")


@pytest.fixture(name="memory_driver")
def memory_driver_fixture() -> Any:
    """A fresh memory driver whose time is Trio's clock (mocked when the test takes
    ``autojump_clock``)."""
    from jobs_trio.testing import memory_driver

    return memory_driver()


@pytest.fixture
def jobs_worker(memory_driver: Any, jobs_registry: Any) -> Any:
    """A test worker of the application's registry on the memory driver."""
    from jobs_trio.testing import new_worker

    return new_worker(memory_driver, jobs_registry)
