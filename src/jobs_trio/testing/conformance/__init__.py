# The driver conformance suite: every test a driver must pass, importable by any driver's tests.
# Apart from jobs_trio.testing because it needs pytest, pytest-trio and Hypothesis ([testing]).
"""Run the suite against your driver from one test module of yours::

    import pytest
    from jobs_trio.testing.conformance import *  # noqa: F403  (the tests and their fixtures)

    @pytest.fixture
    def driver_factory() -> DriverFactory:
        return open_my_driver  # my_clock -> async context manager of a fresh driver

Every test is marked ``trio`` here, so pytest-trio's ``trio_mode`` is not needed."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

# Before any module of the suite is imported: a failed check then shows its values, as a test
# module's own asserts do (pytest rewrites only test modules and what is registered).
pytest.register_assert_rewrite(*(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__)))

from .fixtures import DriverFactory, driver, manual_clock  # noqa: E402

__all__ = ["DriverFactory", "driver", "manual_clock"]


def _gather() -> None:
    """Every ``test_*`` function of every ``test_*`` module here, into this namespace: a test
    module added to the package joins the suite with no list to update."""
    for found in pkgutil.iter_modules(__path__):
        if not found.name.startswith("test_"):
            continue
        module = importlib.import_module(f"{__name__}.{found.name}")
        for name, value in vars(module).items():
            if not (name.startswith("test_") and callable(value)):
                continue
            if name in globals():
                raise RuntimeError(f"two conformance tests are named {name} (one in {module})")
            globals()[name] = pytest.mark.trio(value)
            __all__.append(name)


_gather()
