# Durable steps: results recorded once (fenced by the claim's token) and replayed, steps whose
# record commits in their own transaction, sleeps and event waits that end the attempt as
# suspended. Apart because replay rules live only here.
from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, TypeVarTuple, overload

import trio

from .._core.boundary import check_key, check_name, check_seconds, dump_json, seconds_until
from .._core.errors import Aborted, ConfigError, JobsError, PayloadNotSerialisable, StepError
from .._core.logs import log_event
from .._core.records import Lease, StepRecord, StepStatus
from ..drivers._transaction import Transaction, current_transaction, transaction
from .run_scope import CancelReason

if TYPE_CHECKING:
    from ..drivers.contract import Driver
    from .run_scope import RunScope


_Args = TypeVarTuple("_Args")
_R = TypeVar("_R")

# step.key's namespace: a key is the UUID of (job id, step name) in it, so it is the same on
# every attempt of a step and no other step or job, here or in another job store, shares it.
_KEY_NAMESPACE: Final = uuid.UUID("5d1f1f0e-5a3b-4c1e-9f43-1f0b7d9c2a61")


def _ran_past(name: str, ceiling: float | None) -> str:
    """The message of a step stopped at its ``step_timeout``: the same words whether the step
    ran in the loop or in a thread, so a dead letter reads alike for both."""
    return f"step {name!r} ran past its step_timeout of {ceiling} s"


@contextlib.contextmanager
def _step_deadline(name: str, ceiling: float | None) -> Iterator[None]:
    """An async step's ``step_timeout``: ``trio.fail_after``'s error, with a message. Bare, it
    stored ``TooSlowError: `` as the job's last error, naming neither the step nor the limit.
    Raised only when THIS scope's deadline fired: a ``TooSlowError`` of the step's own (an
    inner ``fail_after``) passes through with its own message."""
    if ceiling is None:
        yield
        return
    with trio.move_on_after(ceiling) as scope:
        yield
    if scope.cancelled_caught:
        raise trio.TooSlowError(_ran_past(name, ceiling))


class StepLimits(Protocol):
    """What steps need of their job: its name (for messages) and the limits its steps run
    under. ``JobDefinition`` is one; named here so that steps, below the registry, need not
    import it (the registry hands ``JobContext`` to bodies, and a context holds steps)."""

    @property
    def name(self) -> str: ...

    @property
    def step_timeout(self) -> float | None: ...

    @property
    def max_result_bytes(self) -> int: ...

    @property
    def event_poll(self) -> float: ...


class Suspension(BaseException):
    """Ends the attempt as ``suspended``. A BaseException, like trio.Cancelled, so a body's
    ``except Exception`` cannot swallow it and run on past a sleep."""

    def __init__(
        self,
        delay: float,
        event: str | None = None,
        seen: str | None = None,
        match: str | None = None,
    ) -> None:
        super().__init__(f"suspended for {delay:.3f}s" + (f" or event {event!r}" if event else ""))
        self.delay = max(delay, 0.0)
        self.event = event
        self.seen = seen  # the mark of the look that found no event (EventLook.seen)
        self.match = match  # the event's key it waits for (None: any)


class EventTimedOut(JobsError):
    code = "X_EVENT_TIMEOUT"
    retryable = False


class Steps:
    """``ctx.step``: one per attempt; replays the job's records from the driver."""

    def __init__(self, driver: Driver, lease: Lease, definition: StepLimits, run: RunScope) -> None:
        self._driver = driver
        self._lease = lease
        self._definition = definition
        self._run = run
        self._records: dict[str, StepRecord] | None = None
        self._used: set[str] = set()
        # The transactions of the step.transaction functions running now, by step name: a step
        # called inside one (its task, or a task it started, sees it as the current
        # transaction) would record itself apart from it, or on SQLite wait on its connection.
        # Steps of other tasks of the body, side by side with it, are not inside it.
        self._open: dict[Transaction, str] = {}
        self.ran: list[str] = []  # steps whose function ran in this attempt (not replayed)

    async def _load(self) -> dict[str, StepRecord]:
        if self._records is None:
            loaded = await self._driver.load_steps(self._lease.job_id)
            self._records = {r.name: r for r in loaded}
        return self._records

    def _use(self, name: str) -> None:
        check_name(name, argument="step name")
        tx = current_transaction()
        inside = None if tx is None else self._open.get(tx)
        if inside is not None:
            raise StepError(
                f"step {name!r} of job {self._definition.name!r} was called inside the function"
                f" of step.transaction({inside!r})",
                fix="call steps one after another in the job body; inside the function, write"
                " through its tx (enqueue and send_event join it)",
            )
        if name in self._used:
            raise StepError(
                f"step {name!r} is used twice in one run of job {self._definition.name!r}",
                fix="give each step call its own name (e.g. add the loop index: f'send-{i}')",
            )
        self._used.add(name)

    def _kind_checked(self, name: str, record: StepRecord | None, called: str) -> StepRecord | None:
        """``record`` if it was written by a step of the kind now ``called`` (run, sleep,
        wait_for_event). A deploy that reuses a name for another kind of step would read the
        old record as the new kind's: an assertion or an AttributeError, retried to the last
        attempt. A finished run's record and a finished sleep's look alike (a sleep's result
        is null): either is taken for the other."""
        if record is None:
            return None
        if record.event is not None or record.status is StepStatus.WAITING:
            recorded = "step.wait_for_event"
        elif record.status is StepStatus.SLEEPING:
            recorded = "step.sleep"
        else:
            recorded = "a finished step.run or step.sleep"
        if recorded == f"step.{called}" or (
            recorded.startswith("a finished") and called != "wait_for_event"
        ):
            return record
        raise StepError(
            f"step {name!r} of job {self._definition.name!r} is recorded as {recorded} (by an"
            f" earlier deploy) and is now called as step.{called}",
            fix=f"give a step of another kind a name of its own (e.g. {name + '-v2'!r}): a job"
            " the old deploy left part-way then runs the new step instead of misreading the old",
        )

    def _refuse_if_cancelled(self, name: str) -> None:
        # After the run scope was cancelled (timeout, lost lease, operator) nothing of this run
        # may be written: another attempt may already own the records. A drain is not such a
        # cancel: the run still holds its claim, and a step its shielded last part records
        # (fenced by the token, like every write) is one the next attempt need not redo.
        if self._run.reason not in (None, CancelReason.DRAINING):
            raise Aborted(
                f"step {name!r} of job {self._lease.job_id}: the run was cancelled "
                f"({self._run.reason}); its write was refused",
                fix="nothing to do: the job runs again and replays its recorded steps",
            )

    def _fenced(self, name: str, what: str) -> Aborted:
        return Aborted(
            f"step {name!r} of job {self._lease.job_id}: the claim is no longer current"
            f" (another worker holds the job); {what}",
            fix="nothing to do: the worker holding the job now replays the steps",
        )

    async def _save(self, record: StepRecord) -> None:
        self._refuse_if_cancelled(record.name)
        if not await self._driver.save_step(self._lease, record):
            raise self._fenced(record.name, "its write was refused")
        assert self._records is not None
        self._records[record.name] = record

    # Typed as ``fn`` returns: an ``async def``'s awaited result, or a plain function's (run in
    # a thread). The value is the JSON round trip of it, so return types JSON keeps as they are.
    @overload
    async def run(self, name: str, fn: Callable[[*_Args], Awaitable[_R]], *args: *_Args) -> _R: ...
    @overload
    async def run(self, name: str, fn: Callable[[*_Args], _R], *args: *_Args) -> _R: ...

    async def run(self, name: str, fn: Callable[[*_Args], Any], *args: *_Args) -> Any:
        """Run ``fn(*args)`` once across every attempt of the job; later calls return its
        recorded result (JSON round-tripped, the same value on the first run and on replay:
        return dicts with string keys, lists, strings, numbers, booleans or None — a tuple
        comes back a list)."""
        self._use(name)
        record = self._kind_checked(name, (await self._load()).get(name), "run")
        if record is not None and record.status is StepStatus.DONE:
            return json.loads(record.result or "null")
        started = self._driver.now()
        ceiling = self._definition.step_timeout
        if not inspect.iscoroutinefunction(fn):
            return await self._run_in_thread(name, started, fn, *args)
        with _step_deadline(name, ceiling):
            result = await fn(*args)
        return await self._record(name, started, result)

    async def _run_in_thread(
        self, name: str, started: float, fn: Callable[..., Any], *args: Any
    ) -> Any:
        """A sync step: its thread is waited for under the run's thread scope, as a sync body's
        is. A drain WAITS for it and records what it returns: abandoned at the drain, the job
        went back to the queue while the thread ran on, and the next worker ran the same step
        beside it (two runs at once). Its timeout, the run's own, a lost lease or an
        operator's cancel still abandon it. Trio's own thread limiter, not the worker's body
        threads: a run may hold several step threads (side by side, or abandoned ones still
        running), and on the worker's limiter they took the thread another queue's sync body,
        holding its slot, was waiting for."""
        await trio.lowlevel.checkpoint_if_cancelled()  # a run already stopped starts no thread
        ceiling = self._definition.step_timeout
        deadline = math.inf if ceiling is None else trio.current_time() + ceiling
        recorded: list[Any] = []
        with self._run.thread_scope(deadline):
            result = await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
            # Inside the shield: a result the drain waited for is recorded, not lost.
            recorded.append(await self._record(name, started, result))
        if recorded:
            return recorded[0]
        if self._run.cancel_scope.cancel_called:
            await trio.lowlevel.checkpoint()  # the run's own cancel: its reason judges it
        raise trio.TooSlowError(_ran_past(name, ceiling))

    async def _record(self, name: str, started: float, result: Any) -> Any:
        """Record a step's result, answer it as replay will (the JSON round trip)."""
        self.ran.append(name)
        text = self._result_text(name, result)
        await self._save(
            StepRecord(name, StepStatus.DONE, started, self._driver.now(), result=text)
        )
        return json.loads(text)

    def _result_text(self, name: str, result: Any) -> str:
        """A step's result as the JSON text its record keeps."""
        try:
            return dump_json(
                result,
                job=self._definition.name,
                what=f"step[{name!r}] result",
                max_bytes=self._definition.max_result_bytes,
            )
        except PayloadNotSerialisable as exc:
            raise StepError(
                f"step {name!r} of job {self._definition.name!r} returned a value that cannot "
                f"be recorded: {exc.cause}",
                fix="return JSON values from a step (ids, dicts, lists, str, numbers)",
            ) from exc

    async def transaction(
        self, name: str, fn: Callable[[Transaction, *_Args], Awaitable[_R]], *args: *_Args
    ) -> _R:
        """Run ``await fn(tx, *args)`` once across every attempt of the job, ``tx`` a
        transaction on the job store's own database (``jobs_trio.transaction(driver)``: its
        SQL, and every enqueue and ``send_event`` inside it, join it), and record the step IN
        that transaction: its writes there and its record commit together or not at all.
        Later calls return the recorded result (the JSON round trip, as ``run``'s).

        The commit is fenced: the claim's token is checked in the transaction under a lock
        every claim of the job must also take, so a worker that lost its lease (paused past
        it, its loop blocked) commits nothing; its run is then cancelled ``lease-lost``."""
        self._use(name)
        self._refuse_outside_the_store(name)
        record = self._kind_checked(name, (await self._load()).get(name), "transaction")
        if record is not None and record.status is StepStatus.DONE:
            return json.loads(record.result or "null")  # type: ignore[no-any-return]
        started = self._driver.now()
        ceiling = self._definition.step_timeout
        async with transaction(self._driver) as tx:
            with _step_deadline(name, ceiling):
                self._open[tx] = name
                tx.step = name
                try:
                    pending = fn(tx, *args)
                    if not inspect.isawaitable(pending):
                        raise StepError(
                            f"step {name!r} of job {self._definition.name!r}: step.transaction"
                            f" was given {getattr(fn, '__name__', fn)!r}, which is not async",
                            fix="pass an async function: `async def fn(tx, *args)` awaiting"
                            " tx.execute(...)",
                        )
                    result = await pending
                finally:
                    del self._open[tx]
                    tx.step = None
            text = self._result_text(name, result)
            done = StepRecord(name, StepStatus.DONE, started, self._driver.now(), result=text)
            await self._save_in(tx, done)
        # Only now, committed: a record rolled back with its transaction is no record.
        self.ran.append(name)
        assert self._records is not None
        self._records[name] = done
        return json.loads(text)  # type: ignore[no-any-return]

    def _refuse_outside_the_store(self, name: str) -> None:
        """``step.transaction`` needs its transaction on the job store's database, and to own
        it: inside another block the record would commit with that block (or, on another
        connection, without it), never with the step's own writes alone."""
        if not callable(getattr(self._driver, "open_transaction", None)):
            raise ConfigError(
                f"step {name!r} of job {self._definition.name!r}: step.transaction needs a"
                f" job store with transactions, and {type(self._driver).__name__} has none",
                fix="run the job on the SQLite or PostgreSQL driver, with the tables the step"
                " writes in that database; elsewhere use step.run with step.key(name) as the"
                " effect's idempotency key",
            )
        if current_transaction() is not None:
            raise StepError(
                f"step {name!r} of job {self._definition.name!r}: step.transaction was called"
                " inside an open jobs_trio.transaction(...) block",
                fix="call it outside the block: the step opens its own transaction on the job"
                " store, and its record commits with exactly the writes of that transaction",
            )

    async def _save_in(self, tx: Transaction, record: StepRecord) -> None:
        """Write ``record`` in ``tx``, fenced by the claim's token (the driver checks it under
        the lock a claim takes). Refused, the run is cancelled ``lease-lost`` and the raised
        Aborted rolls ``tx`` back: nothing of the step is written."""
        self._refuse_if_cancelled(record.name)
        # Shielded: the step's work is done and its commit is the database's to decide. A drain
        # cutting it here would only leave the work for the next attempt to redo; and a zombie
        # whose loop resumes here is refused by the token, whatever its own clock has noticed.
        with trio.CancelScope(shield=True):
            saved = await self._driver.save_step(self._lease, record, connection=tx)
        if not saved:
            lost = self._fenced(record.name, "its transaction was rolled back, nothing written")
            log_event(
                "jobs.step.fenced",
                logging.WARNING,
                job_id=self._lease.job_id,
                job=self._definition.name,
                step=record.name,
                why="the claim is no longer current: another worker took the job over",
            )
            self._run.cancel(CancelReason.LEASE_LOST, lost)
            raise lost

    def key(self, name: str) -> str:
        """An idempotency key for step ``name`` of this job: the same on every attempt and
        every replay, another for every other step or job (a UUID, 36 characters). Pass it to
        a service that deduplicates requests by key (a payment provider's ``Idempotency-Key``):
        an effect outside the database that a crash makes run twice then happens once there."""
        check_name(name, argument="step.key name")
        return str(uuid.uuid5(_KEY_NAMESPACE, f"{self._lease.job_id}\x00{name}"))

    async def sleep(self, name: str, seconds: float) -> None:
        """Suspend the job for ``seconds`` from the first time this step is reached."""
        # Checked before anything is written: a NaN wake-up is never claimed again on
        # PostgreSQL and fails SQLite's NOT NULL, blocking the settle.
        duration = check_seconds(seconds, argument=f"step.sleep({name!r}) seconds")
        self._use(name)
        record = self._kind_checked(name, (await self._load()).get(name), "sleep")
        if record is None:
            now = self._driver.now()
            record = StepRecord(name, StepStatus.SLEEPING, now, wake_at=now + duration)
            await self._save(record)
        await self._sleep_or_suspend(record)

    async def sleep_until(self, name: str, when: dt.datetime | float) -> None:
        """Suspend the job until ``when`` (an aware datetime, or seconds on the driver's clock)."""
        now = self._driver.now()
        wait = seconds_until(when, argument=f"step.sleep_until({name!r}) when", now=now)
        self._use(name)
        record = self._kind_checked(name, (await self._load()).get(name), "sleep")
        if record is None:
            record = StepRecord(name, StepStatus.SLEEPING, now, wake_at=now + wait)
            await self._save(record)
        await self._sleep_or_suspend(record)

    async def _sleep_or_suspend(self, record: StepRecord) -> None:
        if record.status is StepStatus.DONE:
            return
        now = self._driver.now()
        assert record.wake_at is not None
        if now >= record.wake_at:
            await self._save(
                StepRecord(record.name, StepStatus.DONE, record.started_at, now, result="null")
            )
            return
        raise Suspension(record.wake_at - now)

    async def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        match: str | None = None,
        timeout: float | None = None,
        include_earlier: bool = False,
    ) -> Any:
        """Suspend until an event named ``event`` (with key ``match``, when given) is sent, and
        return its payload; raise ``EventTimedOut`` once ``timeout`` seconds have passed since
        the wait began. Events sent before the wait began count only with ``include_earlier``."""
        check_name(event, argument=f"wait_for_event({name!r}) event")
        if match is not None:
            check_key(match, argument=f"wait_for_event({name!r}) match")
        if timeout is not None:
            timeout = check_seconds(timeout, argument=f"wait_for_event({name!r}) timeout")
        self._use(name)
        record = self._kind_checked(name, (await self._load()).get(name), "wait_for_event")
        now = self._driver.now()
        if record is None:
            record = StepRecord(
                name,
                StepStatus.WAITING,
                now,
                wake_at=now + timeout if timeout is not None else None,
                event=event,
                match=match,
            )
            await self._save(record)
        if record.status is StepStatus.DONE:
            return _event_result(name, record)
        # The body passes the same arguments on every replay: nothing about them is stored.
        since = None if include_earlier else record.started_at
        look = await self._driver.look_for_event(event, key=match, since=since)
        found = look.found
        if found is not None:
            text = json.dumps({"payload": json.loads(found.payload), "event_id": found.id})
            done = StepRecord(
                name, StepStatus.DONE, record.started_at, now, result=text, event=event, match=match
            )
            await self._save(done)
            return _event_result(name, done)
        if record.wake_at is not None and now >= record.wake_at:
            done = StepRecord(
                name,
                StepStatus.DONE,
                record.started_at,
                now,
                result='{"timeout":true}',
                event=event,
                match=match,
            )
            await self._save(done)
            return _event_result(name, done)
        poll = self._definition.event_poll
        delay = poll if record.wake_at is None else min(poll, record.wake_at - now)
        # With the look's mark: a send that lands before the suspend is settled finds the job
        # still running and wakes nothing; the settle sees its event past the mark instead.
        raise Suspension(delay, event=event, seen=look.seen, match=match)


def _event_result(name: str, record: StepRecord) -> Any:
    result = json.loads(record.result or "{}")
    if result.get("timeout"):
        raise EventTimedOut(
            f"step {name!r}: no event {record.event!r} arrived in time",
            fix="catch EventTimedOut in the job to take another path, or raise the timeout",
        )
    return result.get("payload")
