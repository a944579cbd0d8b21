# Pausing a queue from application or operator code: the driver's durable pause, then a wait for
# every worker the database has holding jobs of the queue to confirm it heard the pause
# (Driver.pauses_heard). Apart from the driver because the wait spans the fleet: it is what makes
# "nothing of it starts from here" true once the call returns, where the commit alone left the
# jobs a worker held for a slot to start until its next look (PostgreSQL's NOTIFY included).
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import trio

from .._core import render
from .._core.boundary import check_name
from .._core.errors import ConfigError
from .._core.records import PauseHolder, QueuePause, WorkerPresence
from ..drivers.contract import Driver

# How long pause_queue waits by default for the workers holding jobs of the queue. A worker
# hears a pause at once on PostgreSQL (NOTIFY) and in one process, within the SQLite driver's
# poll_interval (0.5 s) in another process, then writes one row: a second covers a loaded
# machine; past five, something keeps that worker from the database (or from running at all).
CONFIRM_WITHIN = 5.0
# How often the wait reads the confirmations: one read of the queue's running jobs by worker
# (an index walk), for as long as one is missing.
_LOOK_EVERY = 0.05


@attrs.frozen
class Unconfirmed:
    """A worker the database had holding jobs of the paused queue that did not confirm it heard
    the pause in time, with what it last told the fleet of itself."""

    worker_id: str
    jobs: int  # its running jobs of the queue: started, or held for a slot
    lease_until: float  # the latest lease among them, driver clock
    presence: WorkerPresence | None  # its announcement (host, pid, release), if it made one

    def why(self, now: float) -> str:
        """What its silence means for the pause, in a sentence for the operator."""
        held = f"holds {self.jobs} job(s) of the queue"
        if self.lease_until <= now:
            return (
                f"{held} whose leases lapsed {render.duration(now - self.lease_until)} ago: it"
                " is gone (killed, its host down), or stopped or cut off from the database for"
                " that long. Gone, it starts nothing, and no worker takes those jobs while the"
                " queue is paused; if it comes back, it stops each run whose lease it could not"
                " renew"
            )
        return (
            f"{held}, leased for {render.duration(self.lease_until - now)} more, yet has not"
            " confirmed: it may start the ones it holds for a slot until it hears the pause."
            " Look at its log (jobs.worker.pauses-failed: its database calls fail), whether it"
            " is stopped, or whether it runs a release that does not confirm pauses"
        )

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "worker_id": self.worker_id,
            "jobs": self.jobs,
            "lease_until": self.lease_until,
            "host": None if self.presence is None else self.presence.host,
            "pid": None if self.presence is None else self.presence.pid,
            "version": None if self.presence is None else self.presence.version,
            "why": self.why(now),
        }


@attrs.frozen
class PauseConfirmation:
    """What ``pause_queue`` answers: the pause on record, the workers holding jobs of its queue
    that confirmed it (``heard``), and those that did not in time (``unconfirmed``). Once it
    is ``confirmed`` nothing of the queue starts anywhere until it is resumed. ``resumed``: the
    pause was taken back (or replaced) before every holder confirmed it."""

    pause: QueuePause
    heard: tuple[str, ...] = ()
    unconfirmed: tuple[Unconfirmed, ...] = ()
    resumed: bool = False

    @property
    def confirmed(self) -> bool:
        return not self.unconfirmed

    def to_json(self, now: float) -> dict[str, object]:
        return {
            **self.pause.to_json(),
            "confirmed": self.confirmed,
            "heard": list(self.heard),
            "unconfirmed": [u.to_json(now) for u in self.unconfirmed],
            "resumed": self.resumed,
        }


async def pause_queue(
    driver: Driver, queue: str, *, by: str | None = None, within: float = CONFIRM_WITHIN
) -> PauseConfirmation:
    """Pause ``queue`` fleet-wide and durably (``Driver.pause_queue``), then wait up to
    ``within`` seconds for each worker holding jobs of it to confirm it heard: when the answer
    is ``confirmed``, no job of the queue starts anywhere from the moment it returned until a
    resume (its running jobs finish). Otherwise the answer names the workers that did not
    confirm and what that means (``Unconfirmed.why``); the pause stands either way. Pausing a
    paused queue waits for the pause on record. ``by``: who paused it, as stats show it."""
    check_name(queue, argument="queue")
    if not (isinstance(within, int | float) and math.isfinite(within) and within >= 0):
        raise ConfigError(
            f"within={within!r}", fix="give the seconds to wait for the workers, 0 or more"
        )
    pause = await driver.pause_queue(queue, by=by)
    return await confirm_pause(driver, pause, within)


async def confirm_pause(driver: Driver, pause: QueuePause, within: float) -> PauseConfirmation:
    """Wait up to ``within`` seconds for every worker holding jobs of ``pause``'s queue to
    confirm its epoch. The holders are read from the database after the pause committed: no
    claim adds one while it stands, and one that ended its jobs meanwhile holds nothing to
    start."""
    deadline = trio.current_time() + within
    heard: dict[str, None] = {}
    while True:
        holders = await driver.pause_holders(pause.queue)
        waiting = _waiting(holders, pause)
        heard.update((h.worker_id, None) for h in holders if h not in waiting)
        if not waiting:
            return PauseConfirmation(pause, tuple(heard))
        if trio.current_time() >= deadline:
            break
        await trio.sleep(_LOOK_EVERY)
    now_paused = {p.queue: p for p in await driver.queue_pauses()}.get(pause.queue)
    if now_paused is None or now_paused.epoch != pause.epoch:
        # Resumed meanwhile (and maybe paused again: that pause's caller waits for its own).
        return PauseConfirmation(pause, tuple(heard), resumed=True)
    return PauseConfirmation(pause, tuple(heard), await _described(driver, waiting))


async def unheard(driver: Driver, pause: QueuePause) -> tuple[Unconfirmed, ...]:
    """The workers holding jobs of ``pause``'s queue that have not confirmed it (yet): what the
    dashboard shows beside a paused queue."""
    return await _described(driver, _waiting(await driver.pause_holders(pause.queue), pause))


def _waiting(holders: Sequence[PauseHolder], pause: QueuePause) -> list[PauseHolder]:
    return [h for h in holders if h.heard is None or h.heard < pause.epoch]


async def _described(driver: Driver, waiting: Sequence[PauseHolder]) -> tuple[Unconfirmed, ...]:
    if not waiting:
        return ()
    presences = {p.worker_id: p for p in await driver.workers()}
    return tuple(
        Unconfirmed(h.worker_id, h.jobs, h.lease_until, presences.get(h.worker_id)) for h in waiting
    )
