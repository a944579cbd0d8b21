# Declaring jobs: a Registry maps names to job definitions, and a definition enqueues itself.
# Apart because it is the boundary where user input (names, options, payloads) is checked.
from __future__ import annotations

import datetime as dt
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypedDict, Unpack, overload

import attrs
from typing_extensions import TypeVar

from .._core.backoff import Backoff
from .._core.boundary import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    INT4_MAX,
    check_int,
    check_key,
    check_limit,
    check_name,
    check_seconds,
    delay_from,
    dump_json,
    shown,
)
from .._core.chunks import enqueue_chunks
from .._core.errors import (
    ConfigError,
    DuplicateJob,
    DuplicateJobName,
    InvalidArgument,
    JobsError,
    unknown_job,
)
from .._core.fleet_limits import FleetLimit, RateLimit, resolve
from .._core.logs import log_event
from .._core.records import Enqueued, JobId, JobState, NewJob, new_job_id, new_job_ids
from .._core.run_context import CaptureContext, RestoreContext, stored_context
from .._cron.schedule import parse_schedule
from .._cron.tasks import Missed, TaskDefinition, check_missed
from ..drivers._rules import DEFAULT_WINDOW_STATES, LIVE_STATES, WINDOW_STATES
from ..drivers._transaction import has_transactions, joined, transaction

if TYPE_CHECKING:
    from .._run.context import JobContext
    from ..drivers.contract import Driver
    from .outbox import Outbox

# A definition keeps its body's payload and result types: ``enqueue`` then takes only what the
# body accepts. The payload is contravariant (a body taking ``dict | None`` may be enqueued
# with no payload), the result covariant; both default to Any, so a bare ``JobDefinition`` (an
# unannotated body, a registry's listing) means "any job".
PayloadT = TypeVar("PayloadT", contravariant=True, default=Any)
ResultT = TypeVar("ResultT", covariant=True, default=Any)
_P = TypeVar("_P")
_R = TypeVar("_R")

# A body: ``async def`` or a plain ``def`` (run in a thread), given the context and the payload.
JobFunction = Callable[["JobContext", PayloadT], Awaitable[ResultT] | ResultT]

# What a cron task's body is handed (TaskDefinition.payload): ``task``, ``scheduled_at``,
# ``scheduled_ts`` and, fired by hand, ``manual``. A task's body must accept it.
TaskPayload = dict[str, Any]
TaskBody = JobFunction[TaskPayload, object]

RunAt = dt.datetime | float
Window = dt.timedelta | float  # a key's window: seconds, or a timedelta


def check_window(
    key: str | None, unique_for: Window | None, states: Iterable[JobState | str] | None
) -> tuple[float | None, tuple[str, ...]]:
    """A key's window as a NewJob carries it: its seconds and the finished states it covers
    (rules.in_window), checked: a window needs a key, a positive length and known states."""
    if unique_for is None:
        raise InvalidArgument(
            "unique_states", "was given without unique_for", fix="give unique_for= too"
        )
    if key is None:
        raise InvalidArgument(
            "unique_for",
            "a window is a key's: none was given",
            fix="give key= too, e.g. key=f'welcome:{user_id}', unique_for=timedelta(days=1)",
        )
    seconds = unique_for.total_seconds() if isinstance(unique_for, dt.timedelta) else unique_for
    seconds = check_seconds(seconds, argument="unique_for")
    if seconds <= 0:
        raise InvalidArgument("unique_for", "is 0", fix="give a window longer than 0 seconds")
    covered: set[str] = set()
    for state in DEFAULT_WINDOW_STATES if states is None else states:
        value = state.value if isinstance(state, JobState) else state
        if value not in _WINDOW_VALUES:
            if value in _LIVE_VALUES:
                continue  # a live job holds its key whatever the window
            raise InvalidArgument(
                "unique_states",
                f"{shown(state)} is not a finished state a window can cover",
                fix="name some of: " + ", ".join(sorted(_WINDOW_VALUES)),
            )
        covered.add(value)
    return seconds, tuple(sorted(covered))


_WINDOW_VALUES = frozenset(state.value for state in WINDOW_STATES)
_LIVE_VALUES = frozenset(state.value for state in LIVE_STATES)

OnDuplicate = Literal["existing", "raise"]


def _positive(name: str, value: float | None, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={value!r} is not a positive number", fix=f"give {name} > 0")


@attrs.frozen(eq=False)
class JobDefinition(Generic[PayloadT, ResultT]):
    """One declared job: its body and every option a worker applies to its attempts.
    ``JobDefinition[P, R]``: the body takes a payload of type ``P`` and returns ``R``."""

    name: str
    fn: JobFunction[PayloadT, ResultT]
    queue: str = "default"
    attempts: int = 3
    timeout: float | None = 60.0
    priority: int = 0
    backoff: Backoff = attrs.field(factory=Backoff)
    terminal: tuple[type[BaseException] | str, ...] = ()  # error types or codes that dead-letter
    step_timeout: float | None = None
    event_poll: float = 60.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES  # also each step's result
    fleet_limit: FleetLimit | None = None  # runs at once, fleet-wide (docs/limits.md)
    rate_limit: RateLimit | None = None  # starts per period, fleet-wide
    # The registry's context hooks (docs/context.md), carried by each of its jobs.
    capture_context: CaptureContext | None = None
    restore_context: RestoreContext | None = None

    # Decided once at declaration: the worker asks for every attempt.
    is_async: bool = attrs.field(init=False)

    @is_async.default
    def _is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def is_terminal(self, error: BaseException) -> bool:
        code = getattr(error, "code", None)
        for item in self.terminal:
            if isinstance(item, str) and code == item:
                return True
            if isinstance(item, type) and isinstance(error, item):
                return True
        return getattr(error, "retryable", True) is False

    def __call__(self, ctx: JobContext, payload: PayloadT) -> ResultT | Awaitable[ResultT]:
        return self.fn(ctx, payload)

    def new_job(
        self,
        payload: PayloadT,
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        key: str | None = None,
        context: Mapping[str, str] | None = None,
        unique_for: Window | None = None,
        unique_states: Iterable[JobState | str] | None = None,
    ) -> NewJob:
        """The row to write, checked: a bad payload, delay, key, window or context raises
        before any write. ``context``: the run's context (docs/context.md); None: the capture
        hook's. ``unique_for`` / ``unique_states``: ``enqueue``'s key window."""
        stored = stored_context(context, self.capture_context)
        row = self._row(
            payload,
            new_job_id(),
            delay_from(delay, run_at),
            self._priority(priority),
            None if key is None else check_key(key, argument="key"),
            stored,
        )
        if unique_for is None and unique_states is None:
            return row
        seconds, states = check_window(key, unique_for, unique_states)
        return attrs.evolve(row, unique_for=seconds, unique_states=states)

    def new_jobs(
        self,
        payloads: Iterable[PayloadT],
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        context: Mapping[str, str] | None = None,
    ) -> list[NewJob]:
        """``enqueue_many``'s rows, checked: one bad payload raises before any write."""
        # What every job of the batch shares is checked once (a batch's Python was a third of
        # its time, issue 35); each payload is still checked before anything is written.
        stored = stored_context(context, self.capture_context)
        seconds, rank = delay_from(delay, run_at), self._priority(priority)
        given = list(payloads)
        try:
            return [
                self._row(p, job_id, seconds, rank, None, stored)
                for p, job_id in zip(given, new_job_ids(len(given)), strict=True)
            ]
        except JobsError:
            # Which payload of the batch: "payload.v is not finite" in a batch of 10,000 left
            # the caller to find it. Found again on this path alone, each payload checked
            # under its index (the loop above stays as cheap as it was).
            for i, payload in enumerate(given):
                self._row(payload, "", seconds, rank, None, stored, what=f"payloads[{i}]")
            raise

    def _priority(self, priority: int | None) -> int:
        return self.priority if priority is None else check_int(priority, argument="priority")

    def _row(
        self,
        payload: Any,
        job_id: JobId,
        delay: float,
        priority: int,
        key: str | None,
        context: str | None,
        what: str = "payload",
    ) -> NewJob:
        """The row for ``payload``, every other argument already checked; ``what`` names it
        in a refusal."""
        return NewJob(
            job_id=job_id,
            name=self.name,
            queue=self.queue,
            payload=dump_json(payload, job=self.name, what=what, max_bytes=self.max_payload_bytes),
            max_attempts=self.attempts,
            priority=priority,
            delay=delay,
            key=key,
            limits=resolve(self.name, self.fleet_limit, self.rate_limit, payload, what),
            context=context,
        )

    # Without a payload the body is handed None: only a body whose payload accepts None may be
    # enqueued so (the first overload); any other takes its payload type and nothing else.
    @overload
    async def enqueue(
        self: JobDefinition[None, Any],
        driver: Driver | Outbox,
        payload: None = None,
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        key: str | None = None,
        unique_for: Window | None = None,
        unique_states: Iterable[JobState | str] | None = None,
        on_duplicate: OnDuplicate = "existing",
        connection: object | None = None,
        context: Mapping[str, str] | None = None,
    ) -> JobId: ...

    @overload
    async def enqueue(
        self,
        driver: Driver | Outbox,
        payload: PayloadT,
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        key: str | None = None,
        unique_for: Window | None = None,
        unique_states: Iterable[JobState | str] | None = None,
        on_duplicate: OnDuplicate = "existing",
        connection: object | None = None,
        context: Mapping[str, str] | None = None,
    ) -> JobId: ...

    async def enqueue(
        self,
        driver: Driver | Outbox,
        payload: Any = None,
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        key: str | None = None,
        unique_for: Window | None = None,
        unique_states: Iterable[JobState | str] | None = None,
        on_duplicate: OnDuplicate = "existing",
        connection: object | None = None,
        context: Mapping[str, str] | None = None,
    ) -> JobId:
        """Write one job; answer its id. With a ``key`` a live job already holds, answer that
        job's id (or raise ``DuplicateJob`` with ``on_duplicate="raise"``); a key deduplicates
        live jobs only (ready, running, suspended, parked): once its job has finished, the
        same key makes a new job. ``unique_for`` (seconds or a timedelta) widens it to a
        window: a job of the key created within it holds the key also once finished, in the
        states ``unique_states`` names (default completed; dead and cancelled may be added).
        Inside a
        ``jobs_trio.transaction(...)`` block the write joins that transaction; ``driver`` may
        be an ``Outbox`` (docs/transactions.md). ``context``: the run's context, e.g.
        ``{"tenant": "t1"}`` (docs/context.md); None: the registry's capture hook's."""
        job = self.new_job(
            payload,
            delay=delay,
            run_at=run_at,
            priority=priority,
            key=key,
            context=context,
            unique_for=unique_for,
            unique_states=unique_states,
        )
        [answer] = await driver.enqueue([job], connection=joined(connection))
        return self.answered(answer, key, on_duplicate)

    def answered(self, answer: Enqueued, key: str | None, on_duplicate: OnDuplicate) -> JobId:
        """What ``enqueue`` answers for the driver's ``answer``: the id written, or the id of
        the job holding the key (``DuplicateJob`` with ``on_duplicate="raise"``)."""
        if not answer.created and on_duplicate == "raise":
            raise DuplicateJob(job=self.name, key=key or "", existing_id=answer.job_id)
        return answer.job_id

    async def enqueue_many(
        self,
        driver: Driver | Outbox,
        payloads: Iterable[PayloadT],
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        connection: object | None = None,
        context: Mapping[str, str] | None = None,
    ) -> list[JobId]:
        """Write many jobs at once, all or none: every payload is checked before anything is
        written, so one bad payload writes none. Every job carries the same ``context``.

        Up to ``ENQUEUE_CHUNK`` jobs (and 64 Mi characters of payload) are one driver call. A
        larger batch is written in chunks of that many, in one transaction (the caller's
        ``connection=``, the current ``jobs_trio.transaction``, or one of its own where the
        driver has them), so that no statement grows with the batch (a million jobs in one
        statement ran past the database's statement timeout), and each chunk logs
        ``jobs.enqueue.progress``.

        The batch's jobs are claimed in the order given (they share their priority and run-at,
        and their ids count up in that order)."""
        jobs = self.new_jobs(
            payloads, delay=delay, run_at=run_at, priority=priority, context=context
        )
        if not jobs:
            return []
        target = joined(connection)
        chunks = enqueue_chunks(jobs)
        if len(chunks) == 1:
            answers = await driver.enqueue(jobs, connection=target)
            return [a.job_id for a in answers]
        if target is None and has_transactions(driver):
            async with transaction(driver) as tx:
                return await self._in_chunks(driver, chunks, len(jobs), tx)
        return await self._in_chunks(driver, chunks, len(jobs), target)

    async def _in_chunks(
        self,
        driver: Driver | Outbox,
        chunks: list[Sequence[NewJob]],
        total: int,
        connection: object | None,
    ) -> list[JobId]:
        ids: list[JobId] = []
        for chunk in chunks:
            answers = await driver.enqueue(chunk, connection=connection)
            ids.extend(a.job_id for a in answers)
            log_event("jobs.enqueue.progress", job=self.name, written=len(ids), of=total)
        return ids


def _terminal(
    terminal: Sequence[type[BaseException] | str],
) -> tuple[type[BaseException] | str, ...]:
    """``terminal=`` checked: exception types and error codes, each a type or a printable
    text. One text alone was read as its letters (terminal="X_PAYLOAD" made every error coded
    "X" terminal), and a code with a NUL or a blank around it could never match."""
    if isinstance(terminal, str):
        raise ConfigError(
            f"terminal={terminal!r} is one text, which would be read letter by letter",
            fix=f"pass a list: terminal=[{terminal!r}]",
        )
    items = tuple(terminal)
    for item in items:
        if isinstance(item, type) and issubclass(item, BaseException):
            continue
        if isinstance(item, str) and item and item.isprintable() and item == item.strip():
            continue
        raise ConfigError(
            f"terminal item {item!r} is neither an exception type nor an error code",
            fix="list exception classes (ValueError) or error codes ('X_PAYLOAD') that end a"
            " job at once, without its remaining attempts",
        )
    return items


def _limit_shown(limit: FleetLimit | RateLimit) -> str:
    """A limit by the numbers its scope's jobs must agree on (its key may differ per job)."""
    if isinstance(limit, FleetLimit):
        return f"FleetLimit({limit.slots})"
    return f"RateLimit({limit.starts}, per={float(limit.per)})"


def _check_shared_scopes(definition: JobDefinition, declared: Iterable[JobDefinition]) -> None:
    """Refuse a job whose fleet or rate limit names a scope another job declared with other
    numbers. A scope is ONE limit (its rows are keyed by the scope, not by the job), so two
    counts on it were not two limits: accepted, 3 bodies of a scope ran at once beside a job
    that declared 1. A scope defaults to the job's name, so a job naming another's name as
    its scope shares that job's limit and is checked against it too."""
    for other in declared:
        for mine, theirs in (
            (definition.fleet_limit, other.fleet_limit),
            (definition.rate_limit, other.rate_limit),
        ):
            if mine is None or theirs is None:
                continue
            scope = mine.scope or definition.name
            if scope != (theirs.scope or other.name):
                continue
            shown_mine, shown_theirs = _limit_shown(mine), _limit_shown(theirs)
            if shown_mine == shown_theirs:
                continue
            rate = " (starts and per)" if isinstance(mine, RateLimit) else ""
            raise ConfigError(
                f"job {definition.name!r} declares {shown_mine} on scope {scope!r}, which job"
                f" {other.name!r} declared with {shown_theirs}: a scope is one limit its jobs"
                " share, so one of the two counts would not hold",
                fix=f"declare the same count on every job of the scope{rate}, or use another scope",
            )


class JobDecorator(Protocol):
    """What ``registry.job(...)`` answers: given the body, its definition, typed by the body's
    payload and its result (awaited, for an ``async def``)."""

    @overload
    def __call__(
        self, fn: Callable[[JobContext, _P], Awaitable[_R]], /
    ) -> JobDefinition[_P, _R]: ...
    @overload
    def __call__(self, fn: Callable[[JobContext, _P], _R], /) -> JobDefinition[_P, _R]: ...


class JobOptions(TypedDict, total=False):
    """``job()``'s options, for ``task()`` to pass on typed (a misspelt one fails the type
    check). Names and types as ``job()`` declares them (tests/typecheck holds them equal); the
    defaults are ``job()``'s."""

    queue: str
    attempts: int
    timeout: float | None
    priority: int
    backoff: Backoff | None
    terminal: Sequence[type[BaseException] | str]
    step_timeout: float | None
    event_poll: float
    max_payload_bytes: int | None
    max_result_bytes: int | None
    fleet_limit: FleetLimit | None
    rate_limit: RateLimit | None


class EnqueueManyOptions(TypedDict, total=False):
    """``enqueue_many``'s options, for the producers (``jobs_trio.sync``, ``jobs_trio.aio``)
    to take typed, said once for both. Names and types as ``JobDefinition.enqueue_many``
    declares them (tests/typecheck holds them equal); the defaults are its."""

    delay: float | None
    run_at: RunAt | None
    priority: int | None
    connection: object | None
    context: Mapping[str, str] | None


class EnqueueOptions(EnqueueManyOptions, total=False):
    """``enqueue``'s options, for the producers as ``EnqueueManyOptions``: those and the key's.
    Names and types as ``JobDefinition.enqueue`` declares them (tests/typecheck holds them
    equal); the defaults are its."""

    key: str | None
    unique_for: Window | None
    unique_states: Iterable[JobState | str] | None
    on_duplicate: OnDuplicate


class Registry:
    """The jobs an application declares; a worker runs the ones its registry knows."""

    def __init__(
        self,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        capture_context: CaptureContext | None = None,
        restore_context: RestoreContext | None = None,
    ) -> None:
        """``max_payload_bytes`` / ``max_result_bytes``: the size limits (of the JSON text) of
        every job declared here that does not set its own; see docs/limits.md.

        ``capture_context()``: the calling request's context, stored with every enqueue that
        passes no ``context=``; ``restore_context(context)``: a context manager that sets the
        application's context variables around each body. Here, not on the worker, because
        ``jobs-trio worker app:registry`` runs a worker from the registry alone
        (docs/context.md)."""
        for hook_name, hook in (
            ("capture_context", capture_context),
            ("restore_context", restore_context),
        ):
            if hook is not None and not callable(hook):
                raise ConfigError(f"{hook_name}={hook!r} is not callable", fix="pass a function")
        self.capture_context = capture_context
        self.restore_context = restore_context
        self._jobs: dict[str, JobDefinition] = {}
        self.max_payload_bytes = check_limit(max_payload_bytes, argument="max_payload_bytes")
        self.max_result_bytes = check_limit(max_result_bytes, argument="max_result_bytes")
        self._tasks: dict[str, TaskDefinition[JobDefinition]] = {}

    def job(
        self,
        name: str,
        *,
        queue: str = "default",
        attempts: int = 3,
        timeout: float | None = 60.0,
        priority: int = 0,
        backoff: Backoff | None = None,
        terminal: Sequence[type[BaseException] | str] = (),
        step_timeout: float | None = None,
        event_poll: float = 60.0,
        max_payload_bytes: int | None = None,
        max_result_bytes: int | None = None,
        fleet_limit: FleetLimit | None = None,
        rate_limit: RateLimit | None = None,
    ) -> JobDecorator:
        """Declare a job: ``@registry.job("emails.send", queue="emails", attempts=5)``.
        ``max_payload_bytes`` / ``max_result_bytes`` default to the registry's.
        ``fleet_limit`` / ``rate_limit``: runs at once and starts per period across the fleet,
        per job or per key of the payload (docs/limits.md)."""
        check_name(name, argument="job name")
        if name in self._jobs:
            raise DuplicateJobName(
                f"job name {name!r} is already declared (by {self._jobs[name].fn.__qualname__})",
                fix="give each job its own name; a worker picks the body by name",
            )
        check_name(queue, argument="queue")
        check_int(attempts, argument="attempts", low=1, high=INT4_MAX)
        _positive("timeout", timeout)
        _positive("step_timeout", step_timeout)
        _positive("event_poll", event_poll, allow_none=False)
        for argument, value, kind in (
            ("fleet_limit", fleet_limit, FleetLimit),
            ("rate_limit", rate_limit, RateLimit),
        ):
            if value is not None and not isinstance(value, kind):
                raise ConfigError(
                    f"{argument}={value!r} is not a {kind.__name__}",
                    fix=f"pass jobs_trio.{kind.__name__}(...)",
                )
        check_int(priority, argument="priority")
        terminal_items = _terminal(terminal)
        payload_limit = (
            self.max_payload_bytes
            if max_payload_bytes is None
            else check_limit(max_payload_bytes, argument="max_payload_bytes")
        )
        result_limit = (
            self.max_result_bytes
            if max_result_bytes is None
            else check_limit(max_result_bytes, argument="max_result_bytes")
        )

        def declare(fn: JobFunction[Any, Any], /) -> JobDefinition[Any, Any]:
            if not callable(fn):
                raise ConfigError(f"job {name!r} body is not callable", fix="decorate a function")
            definition = JobDefinition(
                name=name,
                fn=fn,
                queue=queue,
                attempts=attempts,
                timeout=timeout,
                priority=priority,
                backoff=backoff or Backoff(),
                terminal=terminal_items,
                step_timeout=step_timeout,
                event_poll=event_poll,
                max_payload_bytes=payload_limit,
                max_result_bytes=result_limit,
                fleet_limit=fleet_limit,
                rate_limit=rate_limit,
                capture_context=self.capture_context,
                restore_context=self.restore_context,
            )
            _check_shared_scopes(definition, self._jobs.values())
            self._jobs[name] = definition
            return definition

        return declare

    def task(
        self,
        name: str,
        *,
        cron: str | None = None,
        every: float | dt.timedelta | None = None,
        timezone: str = "UTC",
        missed: Missed | str = Missed.LATEST,
        catch_up: int = 10,
        **job_options: Unpack[JobOptions],
    ) -> Callable[[TaskBody], TaskDefinition[JobDefinition[TaskPayload]]]:
        """Declare a cron task: ``@registry.task("reports.daily", cron="0 9 * * *",
        timezone="Europe/Berlin")``. Each scheduled time enqueues the job ``name`` once per
        fleet; ``job_options`` are ``job()``'s (queue, attempts, timeout...). See docs/tasks.md."""
        schedule = parse_schedule(cron=cron, every=every, timezone=timezone)
        policy = check_missed(missed, catch_up)
        declare_job = self.job(name, **job_options)

        def declare(fn: TaskBody) -> TaskDefinition[JobDefinition[TaskPayload]]:
            task = TaskDefinition(name, declare_job(fn), schedule, policy, catch_up)
            self._tasks[name] = task
            return task

        return declare

    def tasks(self) -> list[TaskDefinition[JobDefinition]]:
        return list(self._tasks.values())

    def get(self, name: str) -> JobDefinition | None:
        return self._jobs.get(name)

    def require(self, name: str) -> JobDefinition:
        definition = self._jobs.get(name)
        if definition is None:
            raise unknown_job(
                name,
                self._jobs,
                where="the registry",
                fix="check the name, or import the module that declares it",
            )
        return definition

    def queues(self) -> list[str]:
        return sorted({d.queue for d in self._jobs.values()})

    def __iter__(self) -> Iterator[JobDefinition]:
        return iter(self._jobs.values())

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs
