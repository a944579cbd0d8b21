# The relay: moves committed outbox rows from the application's database into the job store,
# in batches, each job exactly once. Apart because it is a service beside the worker, started
# with `nursery.start(relay.run)` and stopped by a lifecycle's accept (no new pass) and aclose.
from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import trio

from .driver import Driver
from .errors import ConfigError, JobsError
from .instance_id import instance_id
from .lifecycle import open_own_lifecycle
from .logs import log_event
from .metrics import Metrics, default_metrics
from .outbox import Outbox

if TYPE_CHECKING:
    from .lifecycle import Lifecycle

STOPPED, RUNNING, STOPPING = "stopped", "running", "stopping"


class Relay:
    """Moves rows from ``outbox`` (an ``Outbox``, or the driver opened on the application's
    database) into ``driver`` (the job store).

    One pass: take up to ``batch`` rows under a ``lease`` (another relay skips them), write
    their jobs with ``enqueue_once`` (a job keeps its row's id, so a row written before is a
    no-op), then delete the rows. A relay killed anywhere in a pass leaves its rows to be taken
    again once the lease lapses, and the second write of a job that made it is a no-op: no row
    is lost and no job is stored twice, however many relays run."""

    def __init__(
        self,
        outbox: Outbox | Driver,
        driver: Driver,
        *,
        batch: int = 100,
        poll_interval: float = 1.0,
        lease: float = 60.0,
        relay_id: str | None = None,
        lifecycle: Lifecycle | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store: Driver = outbox.store if isinstance(outbox, Outbox) else outbox
        self.driver = driver
        if not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch={batch!r}", fix="give batch >= 1 rows")
        for name, value in (("poll_interval", poll_interval), ("lease", lease)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name}={value!r}", fix=f"give {name} > 0 seconds")
        self.batch = batch
        self.poll_interval = float(poll_interval)
        self.lease = float(lease)
        self.relay_id = relay_id or instance_id()
        self._lifecycle = lifecycle
        self._metrics = metrics or default_metrics()
        self._state = STOPPED
        self._deadline = math.inf  # the teardown's budget: bound late, only ever tightened
        self._pass_scope: trio.CancelScope | None = None
        self._waiting: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self.moved = 0  # rows this relay moved (created or found already stored), for tests

    @property
    def state(self) -> str:
        return self._state

    # -- what a lifecycle calls ------------------------------------------------------------

    def accept(self, reason: str = "shutdown") -> None:
        """Start no new pass (the wait between passes ends at once); the pass in flight runs
        on, bounded by ``bind``: cut short it would only leave its rows for the next relay."""
        if self._state != RUNNING:
            return
        self._state = STOPPING
        log_event("jobs.relay.stopping", relay=self.relay_id, reason=reason)
        if self._waiting is not None:
            self._waiting.cancel()

    def bind(self, deadline: float) -> None:
        """Bound the pass in flight by ``deadline`` (Trio clock); only ever tightens."""
        if self._state == STOPPED:
            return  # a bind for a shutdown that already ended must not pre-spend the next run
        self._deadline = min(self._deadline, deadline)
        if self._pass_scope is not None:
            self._pass_scope.deadline = min(self._pass_scope.deadline, deadline)

    async def aclose(self) -> Sequence[str]:
        await self.stop()
        return ()  # a relay abandons no job: an unfinished pass leaves its rows in the outbox

    # -- public ----------------------------------------------------------------------------

    async def stop(self) -> None:
        """Start no new pass and wait for the one in flight (unbounded unless a shutdown
        bound it); idempotent."""
        if self._state == STOPPED:
            return
        self.accept("stop")
        await self._stopped.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._state != STOPPED:
            raise ConfigError(
                f"relay {self.relay_id} is already {self._state}",
                fix="start a relay once; stop() it before starting it again",
            )
        self._state = RUNNING
        self._deadline = math.inf
        if self._lifecycle is not None:
            self._lifecycle.register(self)
        log_event("jobs.relay.started", relay=self.relay_id, batch=self.batch)
        try:
            task_status.started()
            while self._state == RUNNING:
                with trio.CancelScope(deadline=self._deadline) as self._pass_scope:
                    moved = await self._one_pass()
                self._pass_scope = None
                if self._state != RUNNING:
                    break
                if moved < self.batch:  # a full batch: more may be waiting, go again at once
                    with trio.CancelScope() as self._waiting:
                        await trio.sleep(self.poll_interval)
                    self._waiting = None
        finally:
            self._pass_scope = self._waiting = None
            self._state = STOPPED
            log_event("jobs.relay.stopped", relay=self.relay_id, moved=self.moved)
            done, self._stopped = self._stopped, trio.Event()
            done.set()

    async def _one_pass(self) -> int:
        """Move one batch; answer how many rows it took (0 when the outbox is empty or a
        database failed: the rows stay, and the next pass tries again)."""
        started = time.monotonic()
        try:
            jobs = await self.store.outbox_claim(
                self.batch, lease=self.lease, relay_id=self.relay_id
            )
            if jobs:
                answers = await self.driver.enqueue_once(jobs)
                # Deleted only once the jobs are stored: a relay that dies before this line
                # leaves the rows for the next relay, whose write of them is a no-op.
                await self.store.outbox_delete([job.job_id for job in jobs])
                self.moved += len(jobs)
                created = sum(answer.created for answer in answers)
                log_event(
                    "jobs.relay.moved",
                    relay=self.relay_id,
                    rows=len(jobs),
                    created=created,
                    already=len(jobs) - created,
                    seconds=round(time.monotonic() - started, 4),
                )
            self._metrics.outbox_observed(await self.store.outbox_stats())
            return len(jobs)
        except JobsError as exc:
            log_event(
                "jobs.relay.pass-failed",
                logging.WARNING,
                relay=self.relay_id,
                error=str(exc),
                fix="nothing is lost: the rows stay in the outbox and the next pass retries",
            )
            return 0


@contextlib.asynccontextmanager
async def open_relay(
    outbox: Outbox | Driver,
    driver: Driver,
    *,
    lifecycle: Lifecycle | None = None,
    drain_on_shutdown: bool = True,
    grace: float = 25.0,
    **options: Any,
) -> AsyncIterator[Relay]:
    """Run a relay for the duration of the block; leaving it stops the relay (the pass in
    flight finishes). A shutdown stops it first (see ``Relay.accept``): like the worker's
    drain this is on by default — given no ``lifecycle``, a relay opened in the main thread
    opens one of its own (``grace`` seconds); ``drain_on_shutdown=False`` opts out."""
    relay = Relay(outbox, driver, lifecycle=lifecycle, **options)
    async with contextlib.AsyncExitStack() as stack:
        if lifecycle is None and drain_on_shutdown:
            relay._lifecycle = await open_own_lifecycle(
                stack, what="relay", name=relay.relay_id, grace=grace
            )
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.run)
            try:
                yield relay
            finally:
                with trio.CancelScope(shield=True):
                    await relay.stop()
