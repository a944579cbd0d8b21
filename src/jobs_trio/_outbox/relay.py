# The relay: moves committed outbox rows from the application's database into the job store,
# in batches, each row decided exactly once. Apart because it is a service beside the worker,
# started with `nursery.start(relay.run)` and stopped by a lifecycle's accept and aclose.
from __future__ import annotations

import contextlib
import enum
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import trio

from .._core.errors import ConfigError, JobsError, RelayFenced
from .._core.instance_id import instance_id
from .._core.logs import log_event
from .._core.metrics import Metrics, default_metrics
from .._core.records import JobId, RelayDecision, RelayOutcome
from .._jobs.outbox import Outbox
from .._run.lifecycle import open_own_lifecycle
from ..drivers.contract import Driver

if TYPE_CHECKING:
    from .._run.lifecycle import Lifecycle


class RelayState(enum.StrEnum):
    """Where a relay is in its run, as ``Relay.state`` reports it."""

    STOPPED = "stopped"  # not started, or stopped
    RUNNING = "running"  # passes, and the wait between them
    STOPPING = "stopping"  # a stop or shutdown: no new pass; the one in flight runs on, bounded


class Relay:
    """Moves rows from ``outbox`` (an ``Outbox``, or the driver opened on the application's
    database) into ``driver`` (the job store), each row decided exactly once: its job created,
    or a no-op because a live job held its key.

    When the outbox is in the job store's own database (``driver.shares_outbox``), a pass is
    ONE transaction there: take up to ``batch`` rows, write their jobs, delete the rows. A relay
    killed anywhere in it leaves everything as it was.

    Otherwise a pass is two databases' writes: take up to ``batch`` rows under a ``lease``
    (another relay skips them) and a ticket the job store gave it, write their jobs with their
    decisions (``relay_enqueue``, one transaction in the job store), delete the rows, then
    forget the decisions. A relay killed before the delete leaves its rows to be taken again
    once the lease lapses, and the next relay's write of them is answered from the decisions:
    the same outcome, whether the job has finished since, been pruned, or its key been freed.
    A relay killed before the forget leaves decisions of rows that are gone; a sweep (every
    ``lease`` seconds) forgets them. A relay PAUSED past its lease (SIGSTOP, a VM freeze) is
    fenced: the relay that took its rows over revoked its ticket in the job store, so its
    write, whenever it wakes, is refused and changes nothing (logged ``jobs.relay.fenced``).
    No row lost, none decided twice, however many relays run."""

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
        self._state = RelayState.STOPPED
        self._deadline = math.inf  # the teardown's budget: bound late, only ever tightened
        self._pass_scope: trio.CancelScope | None = None
        self._waiting: trio.CancelScope | None = None
        self._stopped = trio.Event()
        # Learned at the first pass that gets an answer, and kept: whether the outbox is in the
        # job store's database (relay_in_place), and who the outbox is (outbox_source).
        self._in_place: bool | None = None
        self._source: str | None = None
        self._next_sweep = -math.inf  # Trio clock: when decisions left behind are next swept
        # The ticket the next take is made under, and when (Trio clock) the job store gave it:
        # kept across passes that find nothing, renewed once a lease old (relay_ticket).
        self._ticket: tuple[str, float] | None = None
        self.moved = 0  # rows this relay moved (each one decided, now or before), for tests
        self.fenced = 0  # rows whose write the job store refused (another relay has them)

    @property
    def state(self) -> RelayState:
        return self._state

    # -- what a lifecycle calls ------------------------------------------------------------

    def accept(self, reason: str = "shutdown") -> None:
        """Start no new pass (the wait between passes ends at once); the pass in flight runs
        on, bounded by ``bind``: cut short it would only leave its rows for the next relay."""
        if self._state is not RelayState.RUNNING:
            return
        self._state = RelayState.STOPPING
        log_event("jobs.relay.stopping", relay=self.relay_id, reason=reason)
        if self._waiting is not None:
            self._waiting.cancel()

    def bind(self, deadline: float) -> None:
        """Bound the pass in flight by ``deadline`` (Trio clock); only ever tightens."""
        if self._state is RelayState.STOPPED:
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
        if self._state is RelayState.STOPPED:
            return
        self.accept("stop")
        await self._stopped.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._state is not RelayState.STOPPED:
            raise ConfigError(
                f"relay {self.relay_id} is already {self._state}",
                fix="start a relay once; stop() it before starting it again",
            )
        self._state = RelayState.RUNNING
        self._deadline = math.inf
        if self._lifecycle is not None:
            self._lifecycle.register(self)
        log_event("jobs.relay.started", relay=self.relay_id, batch=self.batch)
        try:
            task_status.started()
            while self._state is RelayState.RUNNING:
                with trio.CancelScope(deadline=self._deadline) as self._pass_scope:
                    moved = await self._one_pass()
                self._pass_scope = None
                if self._state is not RelayState.RUNNING:
                    break
                if moved < self.batch:  # a full batch: more may be waiting, go again at once
                    with trio.CancelScope() as self._waiting:
                        await trio.sleep(self.poll_interval)
                    self._waiting = None
        finally:
            self._pass_scope = self._waiting = None
            self._state = RelayState.STOPPED
            log_event("jobs.relay.stopped", relay=self.relay_id, moved=self.moved)
            done, self._stopped = self._stopped, trio.Event()
            done.set()

    async def _one_pass(self) -> int:
        """Move one batch; answer how many rows it took (0 when the outbox is empty or a
        database failed: the rows stay, and the next pass tries again)."""
        started = time.monotonic()
        try:
            if self._in_place is None:
                self._in_place = await self.driver.shares_outbox(self.store)
                log_event(
                    "jobs.relay.mode",
                    relay=self.relay_id,
                    mode="in-place" if self._in_place else "two-step",
                )
            if self._in_place:
                decisions = await self.driver.relay_in_place(self.store, self.batch)
            else:
                decisions = await self._two_steps()
            if decisions:
                self.moved += len(decisions)
                fresh = [d for d in decisions if not d.already]
                log_event(
                    "jobs.relay.moved",
                    relay=self.relay_id,
                    rows=len(decisions),
                    created=sum(d.outcome is RelayOutcome.CREATED for d in fresh),
                    key_held=sum(d.outcome is RelayOutcome.KEY_HELD for d in fresh),
                    already=len(decisions) - len(fresh),
                    seconds=round(time.monotonic() - started, 4),
                )
            await self._sweep()
            self._metrics.outbox_observed(await self.store.outbox_stats())
            return len(decisions)
        except JobsError as exc:
            log_event(
                "jobs.relay.pass-failed",
                logging.WARNING,
                relay=self.relay_id,
                error=str(exc),
                fix="nothing is lost: the rows stay in the outbox and the next pass retries",
            )
            return 0

    async def _two_steps(self) -> Sequence[RelayDecision]:
        source = await self._outbox_source()
        ticket = await self._next_ticket(source)
        batch = await self.store.outbox_claim(
            self.batch, lease=self.lease, relay_id=self.relay_id, ticket=ticket
        )
        if not batch.jobs:
            return []
        self._ticket = None  # spent on these rows, whatever becomes of their write
        try:
            decisions = await self.driver.relay_enqueue(
                batch.jobs, source=source, ticket=ticket, superseded=batch.superseded
            )
        except RelayFenced as exc:
            # Paused (or slower than the lease) between the take and this write: another relay
            # took the rows over and revoked the ticket. Nothing was written; the rows are its.
            self.fenced += len(batch.jobs)
            log_event(
                "jobs.relay.fenced",
                logging.WARNING,
                relay=self.relay_id,
                rows=len(batch.jobs),
                ticket=ticket,
                error=str(exc),
                fix=exc.fix,
            )
            return []
        ids = [job.job_id for job in batch.jobs]
        # Deleted only once the decisions are stored: a relay that dies before this line
        # leaves the rows to be taken again, and they are answered from the decisions. Only
        # the rows still marked with this ticket: one another relay took over meanwhile is its
        # to delete, and its decision must stay on record until it has written.
        removed = await self.store.outbox_delete(ids, ticket=ticket)
        # Forgotten only once the rows are gone (none can be taken again): a relay that dies
        # before this line leaves the decisions to the sweep.
        await self.driver.relay_forget(source, removed)
        return decisions

    async def _next_ticket(self, source: str) -> str:
        """The ticket for the next take: the one in hand while it is younger than a lease (an
        idle relay's passes find nothing and spend none), else a new one from the job store.
        Got BEFORE the take, so a relay that takes these rows over later can revoke it."""
        if self._ticket is not None and trio.current_time() - self._ticket[1] < self.lease:
            return self._ticket[0]
        ticket = await self.driver.relay_ticket(source, relay_id=self.relay_id, lease=self.lease)
        self._ticket = (ticket, trio.current_time())
        return ticket

    async def _sweep(self) -> None:
        """Forget the decisions whose rows are gone from the outbox, left by a relay that died
        between its delete and its forget. Safe whenever it runs: a decision is recorded after
        its row was taken, so a row missing once the decision is read is gone for good."""
        if trio.current_time() < self._next_sweep:
            return
        self._next_sweep = trio.current_time() + self.lease
        source = await self._outbox_source()
        # Older than a lease: a younger one's own relay is most likely about to forget it.
        decided = await self.driver.relay_decisions(
            source, before=self.driver.now() - self.lease, limit=self.batch
        )
        if not decided:
            return
        present = set(await self.store.outbox_present(decided))
        gone: list[JobId] = [job_id for job_id in decided if job_id not in present]
        if gone:
            forgotten = await self.driver.relay_forget(source, gone)
            log_event("jobs.relay.swept", relay=self.relay_id, decisions=forgotten)

    async def _outbox_source(self) -> str:
        if self._source is None:
            self._source = await self.store.outbox_source()
        return self._source


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
