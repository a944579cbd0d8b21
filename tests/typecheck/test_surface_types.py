# The typed surface, checked by mypy (`nox -s lint`; warn_unused_ignores is on here): each
# assert_type pins what a call answers, and each `type: ignore[...]` marks a call mypy must
# refuse — were a type erased to Any, the ignore would go unused and mypy would fail on it.
# Apart from the behaviour tests because its checks are the type checker's; pytest runs it too,
# so every declaration here is also a working one.
from __future__ import annotations

import inspect
from typing import Any, assert_type, get_overloads, get_type_hints

import pytest

import jobs_trio
import jobs_trio._core.errors
from jobs_trio import (
    AttemptCancelled,
    EventTimedOut,
    JobContext,
    JobDefinition,
    JobsError,
    Registry,
    Worker,
    open_worker,
)
from jobs_trio._core.records import JobId
from jobs_trio._cron.tasks import TaskDefinition
from jobs_trio._jobs.outbox import Outbox
from jobs_trio._jobs.registry import EnqueueManyOptions, EnqueueOptions, JobOptions
from jobs_trio.drivers.contract import Driver
from jobs_trio.testing import memory_driver, new_worker, run_until_idle

registry = Registry()


@registry.job("typed.fulfil")
async def fulfil(ctx: JobContext, payload: dict[str, int]) -> list[str]:
    return sorted(payload)


@registry.job("typed.resize")
def resize(ctx: JobContext, payload: int) -> str:  # a sync body: run in a thread
    return "x" * payload


@registry.job("typed.maybe")
async def maybe(ctx: JobContext, payload: dict[str, int] | None) -> None:
    pass


async def _sum(a: int, b: str) -> float:
    return a + len(b)


def _upper(text: str) -> str:
    return text.upper()


@registry.job("typed.steps")
async def steps(ctx: JobContext, payload: None) -> float:
    total = await ctx.step.run("sum", _sum, 1, "ab")
    assert_type(total, float)
    text = await ctx.step.run("upper", _upper, "a")
    assert_type(text, str)
    return total + len(text)


async def _row(tx: jobs_trio.Transaction, n: int) -> str:
    await tx.execute("SELECT 1")
    return str(n)


async def _transactional(ctx: JobContext) -> None:
    """Typed as step.run is: ``fn(tx, *args)``'s result, ``args`` checked (never run here:
    step.transaction needs a job store with transactions)."""
    text = await ctx.step.transaction("row", _row, 1)
    assert_type(text, str)
    assert_type(ctx.step.key("row"), str)


@registry.task("typed.daily", cron="0 9 * * *")
async def daily(ctx: JobContext, payload: dict[str, Any]) -> None:
    pass


def test_a_declaration_keeps_the_body_s_payload_and_result_types() -> None:
    assert_type(fulfil, JobDefinition[dict[str, int], list[str]])
    assert_type(resize, JobDefinition[int, str])  # a sync body's result is its return value
    assert_type(steps, JobDefinition[None, float])
    assert_type(daily, TaskDefinition[JobDefinition[dict[str, Any]]])


def test_a_bare_definition_is_any_job() -> None:
    listed: list[JobDefinition] = list(registry)
    assert_type(listed[0], JobDefinition[Any, Any])
    assert {d.name for d in listed} >= {"typed.fulfil", "typed.resize", "typed.steps"}


async def _refused_calls_never_run(driver: Any) -> None:
    """Calls mypy must refuse: each ignore is used only while the types are kept."""
    await fulfil.enqueue(driver, "not a dict")  # type: ignore[arg-type]
    await fulfil.enqueue(driver)  # type: ignore[call-arg]  # the body would be handed None
    await fulfil.enqueue_many(driver, [{"a": 1}, 2])  # type: ignore[list-item]
    resize.new_job("3")  # type: ignore[arg-type]

    @registry.task("typed.wrong", every=60)  # type: ignore[arg-type]  # a task hands a dict
    async def wrong(ctx: JobContext, payload: int) -> None:
        pass

    registry.task("typed.typo", every=60, atempts=2)  # type: ignore[call-arg]

    async def bad_steps(ctx: JobContext) -> None:
        await ctx.step.run("sum", _sum, 1, 2)  # type: ignore[arg-type, call-arg]
        await ctx.step.run("sum", _sum, 1)  # type: ignore[arg-type]
        await ctx.step.run("upper", _upper, 1)  # type: ignore[arg-type]
        _number: int = await ctx.step.run("upper", _upper, "a")  # type: ignore[arg-type]
        await ctx.step.transaction("row", _row, "one")  # type: ignore[arg-type]
        await ctx.step.transaction("row", _upper, "a")  # type: ignore[arg-type]  # not (tx, ...)

    open_worker(driver, registry, concurency=3)  # type: ignore[call-arg]


async def test_enqueue_takes_the_body_s_payload_and_answers_job_ids() -> None:
    driver = memory_driver()
    ids = [
        await fulfil.enqueue(driver, {"b": 1, "a": 2}),
        await resize.enqueue(driver, 3, key="three"),
        await maybe.enqueue(driver),  # its body takes None: no payload is fine
        await steps.enqueue(driver),
    ]
    assert_type(ids[0], JobId)
    assert_type(await fulfil.enqueue_many(driver, [{"c": 3}]), list[JobId])
    outcomes = await run_until_idle(new_worker(driver, registry, queues=["default"]))
    assert {o.kind for o in outcomes} == {"completed"}
    records = [await driver.get(i) for i in ids]
    assert [r.result for r in records if r is not None] == [
        ["a", "b"],
        "xxx",
        None,
        4,
    ]


async def test_a_misspelt_worker_option_fails_at_the_call() -> None:
    with pytest.raises(TypeError, match="concurency"):
        open_worker(memory_driver(), registry, concurency=3)  # type: ignore[call-arg]


def test_open_worker_spells_out_exactly_the_worker_s_options() -> None:
    # Said in two signatures so that each is checked; held equal here (name, type, default).
    def options(fn: Any, *own: str) -> dict[str, tuple[Any, Any]]:
        params = inspect.signature(fn).parameters.values()
        return {
            p.name: (p.annotation, p.default)
            for p in params
            if p.kind is p.KEYWORD_ONLY and p.name not in own
        }

    worker = options(Worker.__init__)
    assert options(open_worker, "drain_on_shutdown", "grace") == worker
    assert {"concurrency", "queues", "lease", "retention"} <= worker.keys()


def test_every_error_raised_is_in_the_public_catalogue_and_the_package_s_are_among_them() -> None:
    # jobs_trio._core.errors holds every error raised on purpose (EventTimedOut lives with
    # steps): each is importable from jobs_trio.errors, the public catalogue, never only from a
    # private module; jobs_trio itself carries the ones an application catches or raises.
    import jobs_trio.errors

    raised = {
        obj
        for obj in vars(jobs_trio._core.errors).values()
        if isinstance(obj, type) and issubclass(obj, JobsError | AttemptCancelled)
    }
    catalogue = {getattr(jobs_trio.errors, name) for name in jobs_trio.errors.__all__}
    assert sorted(e.__name__ for e in raised - catalogue) == []
    exported = {getattr(jobs_trio, name) for name in jobs_trio._WHERE}
    errors = {e for e in exported if isinstance(e, type) and issubclass(e, BaseException)}
    assert errors - {EventTimedOut} <= catalogue


def test_task_passes_on_exactly_the_job_s_options() -> None:
    job = inspect.signature(Registry.job).parameters.values()
    hints = get_type_hints(Registry.job)
    declared = {p.name: hints[p.name] for p in job if p.kind is p.KEYWORD_ONLY}
    assert get_type_hints(JobOptions) == declared


def test_each_enqueue_overload_offers_the_implementation_s_keywords() -> None:
    # An option added to the implementation but to no overload would be one no caller may pass.
    method = JobDefinition.enqueue

    def keywords(fn: Any) -> dict[str, tuple[Any, Any]]:
        params = inspect.signature(fn).parameters.values()
        return {p.name: (p.annotation, p.default) for p in params if p.kind is p.KEYWORD_ONLY}

    overloads = get_overloads(method)
    assert len(overloads) == 2
    assert all(keywords(o) == keywords(method) for o in overloads)


def test_the_producers_take_exactly_enqueue_s_options() -> None:
    # jobs_trio.sync and jobs_trio.aio take enqueue's and enqueue_many's keywords as
    # EnqueueOptions / EnqueueManyOptions: one added to JobDefinition's and not there would be
    # one no producer may pass.
    for options, method in (
        (EnqueueOptions, JobDefinition.enqueue),
        (EnqueueManyOptions, JobDefinition.enqueue_many),
    ):
        params = inspect.signature(method).parameters.values()
        hints = get_type_hints(method, localns={"Driver": Driver, "Outbox": Outbox})
        declared = {p.name: hints[p.name] for p in params if p.kind is p.KEYWORD_ONLY}
        assert get_type_hints(options) == declared


def test_driver_options_are_open_driver_s_keywords() -> None:
    from jobs_trio import DriverOptions, open_driver

    signature = inspect.signature(open_driver).parameters.values()
    hints = get_type_hints(open_driver)
    declared = {p.name: hints[p.name] for p in signature if p.kind is p.KEYWORD_ONLY}
    assert get_type_hints(DriverOptions) == declared
    misspelt: DriverOptions = {"pool_sise": 3}  # type: ignore[typeddict-unknown-key]
    assert misspelt


def test_the_type_checker_sees_the_public_names_and_no_other() -> None:
    # jobs_trio loads its names lazily (a module __getattr__, out of the type checkers' sight):
    # a name it does not have is refused by mypy (the ignore below would go unused otherwise),
    # and a name it has keeps its type.
    assert_type(jobs_trio.Registry, type[Registry])
    assert_type(jobs_trio.__version__, str)
    with pytest.raises(AttributeError):
        jobs_trio.Regsitry  # type: ignore[attr-defined]  # noqa: B018
