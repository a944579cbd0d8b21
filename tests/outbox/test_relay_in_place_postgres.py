# The one-database relay on PostgreSQL makes its batch's jobs between two statements of its
# transaction, in time that grows with the batch: past the pool's bound on an idle transaction
# the server ended every pass of a large --batch and the outbox never drained (a review).
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import jobs_trio
from jobs_trio._core.metrics import Metrics
from jobs_trio.driver import Driver
from jobs_trio.testing.conformance.helpers import new_job

pytestmark = pytest.mark.postgres

pytest.importorskip("asyncpg")

from jobs_trio.drivers.postgres import _outbox_relay  # noqa: E402

# Past the pool's 1 s bound on a transaction left idle.
SLOW = 1.5


async def test_a_pass_in_place_whose_jobs_take_long_to_make_still_moves_them(
    pg_driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = pg_driver
    made: Callable[..., Any] = _outbox_relay._outbox_jobs

    def slowly(*args: Any) -> Any:
        time.sleep(SLOW)  # a batch of 150,000 rows under load: the loop does nothing else
        return made(*args)

    monkeypatch.setattr(_outbox_relay, "_outbox_jobs", slowly)
    rows = [new_job(payload={"n": n}) for n in range(3)]
    await driver.outbox_write(rows)  # type: ignore[attr-defined]
    relay = jobs_trio.Relay(
        jobs_trio.Outbox(driver),  # type: ignore[arg-type]
        driver,
        metrics=Metrics(CollectorRegistry()),
    )
    assert await relay._one_pass() == 3
    assert (await driver.outbox_stats()).pending == 0  # type: ignore[attr-defined]
    for row in rows:
        assert await driver.get(row.job_id) is not None
