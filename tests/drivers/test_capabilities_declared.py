# What each driver of this package declares it does beyond the core contract (Capabilities),
# spelled out field by field: `Capabilities.every(...)` says it short, and must say the same.
from __future__ import annotations

import attrs
import pytest

from jobs_trio.driver import Capabilities
from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.drivers.sqlite import SqliteDriver

DECLARED = {
    "memory": dict.fromkeys(attrs.asdict(Capabilities()), True),
    "sqlite": {**dict.fromkeys(attrs.asdict(Capabilities()), True), "claims_side_by_side": False},
    "postgres": dict.fromkeys(attrs.asdict(Capabilities()), True),
}


def test_every_turns_each_on_but_those_named() -> None:
    assert set(attrs.asdict(Capabilities.every()).values()) == {True}
    assert Capabilities.every(renews_beside=False) == attrs.evolve(
        Capabilities.every(), renews_beside=False
    )
    assert set(attrs.asdict(Capabilities()).values()) == {False}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_each_driver_declares_what_it_has(name: str) -> None:
    if name == "postgres":
        driver = pytest.importorskip("jobs_trio.drivers.postgres").PostgresDriver
    else:
        driver = {"memory": MemoryDriver, "sqlite": SqliteDriver}[name]
    assert attrs.asdict(driver.capabilities) == DECLARED[name]
