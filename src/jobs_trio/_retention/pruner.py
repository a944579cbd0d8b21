# Retention as a worker runs it: every so often, ask the driver for the fleet's prune turn and
# delete finished jobs in bounded batches while it is held. Apart from the worker (its only tie
# is its lifetime) and from the drivers (they only answer one batch; "one pruner" is theirs).
from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

import attrs
import trio

from .._core.boundary import check_int, check_seconds
from .._core.errors import DriverError
from .._core.logs import log_event
from .._core.metrics import Metrics, default_metrics
from .._core.records import PruneTurn
from ..drivers.contract import Driver

DAY = 86_400.0
# How long a pruner holds the fleet's turn between its batches: far longer than a batch, so a
# turn frees itself only when its holder is gone.
TURN_HOLD = 60.0
# After a failed batch (the database away), the next tick is this far off.
RETRY_AFTER = 30.0


def _seconds(value: object, argument: str) -> float:
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    return check_seconds(value, argument=argument)


def _keep_finished(value: object) -> float:
    return _seconds(value, "keep_finished")


def _keep_dead(value: object) -> float | None:
    return None if value is None else _seconds(value, "keep_dead")


def _every(value: object) -> float:
    return _seconds(value, "every")


def _batch(value: object) -> int:
    return check_int(value, argument="batch", low=1, high=100_000)


@attrs.frozen
class Retention:
    """How long finished jobs are kept (``open_worker(retention=...)``; None keeps them all).
    ``keep_finished``: completed and cancelled jobs, seconds or a timedelta (default one day);
    ``keep_dead``: dead-lettered ones, kept longer for an operator to re-run (default seven
    days; None keeps them). ``every``: seconds between the fleet's prune turns (one worker
    takes each); ``batch``: jobs deleted per transaction."""

    keep_finished: float = attrs.field(default=DAY, converter=_keep_finished)
    keep_dead: float | None = attrs.field(default=7 * DAY, converter=_keep_dead)
    every: float = attrs.field(default=300.0, converter=_every)
    batch: int = attrs.field(default=1000, converter=_batch)

    def turn(self, holder: str, *, every: float | None = None) -> PruneTurn:
        return PruneTurn(
            holder,
            keep_finished=self.keep_finished,
            keep_dead=self.keep_dead,
            limit=self.batch,
            hold=TURN_HOLD,
            every=self.every if every is None else every,
        )


async def prune_all(
    driver: Driver, turn: PruneTurn, *, on_batch: Callable[[int], None] | None = None
) -> int | None:
    """Delete in batches while the turn is held; answer how many went, None when another
    pruner held the turn (or the fleet's last turn ended under ``turn.every`` ago).
    ``on_batch`` hears each batch's count (the CLI's progress)."""
    deleted = 0
    while True:
        pruned = await driver.prune(turn)
        if not pruned.turn:
            return None if deleted == 0 else deleted
        deleted += pruned.deleted
        if on_batch is not None:
            on_batch(pruned.deleted)
        if not pruned.more:
            return deleted
        # A long backlog is many transactions, never one: let the rest of the worker run
        # (and a stop cancel us) between them.
        await trio.lowlevel.checkpoint()


class Pruner:
    """A worker's retention service. Start it with ``nursery.start(pruner.run)``; cancel its
    scope to stop it (a batch in flight then rolls back, or has committed whole)."""

    def __init__(
        self, driver: Driver, retention: Retention, holder: str, *, metrics: Metrics | None = None
    ) -> None:
        self.driver = driver
        self.retention = retention
        self.holder = holder
        self._metrics = metrics or default_metrics()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        turn = self.retention.turn(self.holder)
        while True:
            wait = self.retention.every
            try:
                deleted = await prune_all(self.driver, turn, on_batch=self._metrics.jobs_pruned.inc)
            except DriverError as exc:
                log_event("jobs.prune.failed", logging.WARNING, error=str(exc))
                wait = min(wait, RETRY_AFTER)
            else:
                if deleted:
                    log_event("jobs.prune.deleted", worker=self.holder, jobs=deleted)
            await trio.sleep(wait)


DEFAULT_RETENTION = Retention()
