# Declaring jobs: a Registry maps names to job definitions, and a definition enqueues itself.
# Apart because it is the boundary where user input (names, options, payloads) is checked.
from __future__ import annotations

import datetime as dt
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from .backoff import Backoff
from .errors import ConfigError, DuplicateJob, DuplicateJobName, UnknownJob
from .payload import dump_json
from .records import JobId, NewJob, new_job_id
from .schedule import parse_schedule
from .tasks import Missed, TaskDefinition, check_missed

if TYPE_CHECKING:
    from .context import JobContext
    from .driver import Driver

JobFunction = Callable[..., Any]
RunAt = dt.datetime | float
OnDuplicate = Literal["existing", "raise"]


def _positive(name: str, value: float | None, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={value!r} is not a positive number", fix=f"give {name} > 0")


@attrs.frozen(eq=False)
class JobDefinition:
    """One declared job: its body and every option a worker applies to its attempts."""

    name: str
    fn: JobFunction
    queue: str = "default"
    attempts: int = 3
    timeout: float | None = 60.0
    priority: int = 0
    backoff: Backoff = attrs.field(factory=Backoff)
    terminal: tuple[type[BaseException] | str, ...] = ()  # error types or codes that dead-letter
    step_timeout: float | None = None
    event_poll: float = 60.0

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

    def __call__(self, ctx: JobContext, payload: Any) -> Any | Awaitable[Any]:
        return self.fn(ctx, payload)

    def new_job(
        self,
        payload: Any,
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        key: str | None = None,
    ) -> NewJob:
        """The row to write, checked: a bad payload, delay or key raises before any write."""
        return NewJob(
            job_id=new_job_id(),
            name=self.name,
            queue=self.queue,
            payload=dump_json(payload, job=self.name),
            max_attempts=self.attempts,
            priority=self.priority if priority is None else _check_priority(priority),
            delay=_delay_from(delay, run_at),
            key=_check_key(key),
        )

    async def enqueue(
        self,
        driver: Driver,
        payload: Any = None,
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        key: str | None = None,
        on_duplicate: OnDuplicate = "existing",
        connection: object | None = None,
    ) -> JobId:
        """Write one job; answer its id. With a ``key`` a live job already holds, answer that
        job's id (or raise ``DuplicateJob`` with ``on_duplicate="raise"``)."""
        job = self.new_job(payload, delay=delay, run_at=run_at, priority=priority, key=key)
        [answer] = await driver.enqueue([job], connection=connection)
        if not answer.created and on_duplicate == "raise":
            raise DuplicateJob(job=self.name, key=key or "", existing_id=answer.job_id)
        return answer.job_id

    async def enqueue_many(
        self,
        driver: Driver,
        payloads: Iterable[Any],
        *,
        delay: float | None = None,
        run_at: RunAt | None = None,
        priority: int | None = None,
        connection: object | None = None,
    ) -> list[JobId]:
        """Write many jobs in one driver call; every payload is checked before anything is
        written, so one bad payload writes none."""
        jobs = [self.new_job(p, delay=delay, run_at=run_at, priority=priority) for p in payloads]
        if not jobs:
            return []
        answers = await driver.enqueue(jobs, connection=connection)
        return [a.job_id for a in answers]


def _check_priority(priority: int) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ConfigError(
            f"priority={priority!r} is not an int", fix="pass an int (lower runs sooner)"
        )
    return priority


def _check_key(key: str | None) -> str | None:
    if key is not None and (not isinstance(key, str) or not key or len(key) > 512):
        raise ConfigError(
            f"key={key!r} is not a non-empty str of at most 512 characters",
            fix="pass a short str such as 'welcome:42', or no key",
        )
    return key


def _delay_from(delay: float | None, run_at: RunAt | None) -> float:
    if delay is not None and run_at is not None:
        raise ConfigError("both delay= and run_at= were given", fix="pass one of them")
    if run_at is not None:
        if isinstance(run_at, dt.datetime):
            if run_at.tzinfo is None:
                raise ConfigError(
                    f"run_at={run_at!r} has no time zone",
                    fix="pass an aware datetime, e.g. datetime.now(timezone.utc) + timedelta(...)",
                )
            return max(0.0, run_at.timestamp() - time.time())
        if isinstance(run_at, int | float) and math.isfinite(run_at):
            return max(0.0, float(run_at) - time.time())
        raise ConfigError(
            f"run_at={run_at!r} is not a time", fix="pass an aware datetime or epoch seconds"
        )
    if delay is None:
        return 0.0
    if not isinstance(delay, int | float) or not math.isfinite(delay) or delay < 0:
        raise ConfigError(f"delay={delay!r} is not a number of seconds >= 0", fix="pass delay >= 0")
    return float(delay)


class Registry:
    """The jobs an application declares; a worker runs the ones its registry knows."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobDefinition] = {}
        self._tasks: dict[str, TaskDefinition] = {}

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
    ) -> Callable[[JobFunction], JobDefinition]:
        """Declare a job: ``@registry.job("emails.send", queue="emails", attempts=5)``."""
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ConfigError(
                f"job name {name!r} is not a non-empty str", fix="name it like 'emails.send'"
            )
        if name in self._jobs:
            raise DuplicateJobName(
                f"job name {name!r} is already declared (by {self._jobs[name].fn.__qualname__})",
                fix="give each job its own name; a worker picks the body by name",
            )
        if not isinstance(queue, str) or not queue:
            raise ConfigError(
                f"queue {queue!r} is not a non-empty str", fix="name the queue, e.g. 'emails'"
            )
        if not isinstance(attempts, int) or attempts < 1:
            raise ConfigError(f"attempts={attempts!r} for job {name!r}", fix="give attempts >= 1")
        _positive("timeout", timeout)
        _positive("step_timeout", step_timeout)
        _positive("event_poll", event_poll, allow_none=False)
        _check_priority(priority)

        def declare(fn: JobFunction) -> JobDefinition:
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
                terminal=tuple(terminal),
                step_timeout=step_timeout,
                event_poll=event_poll,
            )
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
        **job_options: Any,
    ) -> Callable[[JobFunction], TaskDefinition]:
        """Declare a cron task: ``@registry.task("reports.daily", cron="0 9 * * *",
        timezone="Europe/Berlin")``. Each scheduled time enqueues the job ``name`` once per
        fleet; ``job_options`` are ``job()``'s (queue, attempts, timeout...). See docs/tasks.md."""
        schedule = parse_schedule(cron=cron, every=every, timezone=timezone)
        policy = check_missed(missed, catch_up)
        declare_job = self.job(name, **job_options)

        def declare(fn: JobFunction) -> TaskDefinition:
            task = TaskDefinition(name, declare_job(fn), schedule, policy, catch_up)
            self._tasks[name] = task
            return task

        return declare

    def tasks(self) -> list[TaskDefinition]:
        return list(self._tasks.values())

    def get(self, name: str) -> JobDefinition | None:
        return self._jobs.get(name)

    def require(self, name: str) -> JobDefinition:
        definition = self._jobs.get(name)
        if definition is None:
            known = ", ".join(sorted(self._jobs)) or "none"
            raise UnknownJob(
                f"no job named {name!r} is declared (known: {known})",
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
