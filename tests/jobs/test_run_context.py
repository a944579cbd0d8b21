# The per-run context end to end on the memory driver: what an enqueue stores (explicit, or the
# registry's capture hook), the boundary's refusals, ctx.context, and the restore hook around
# async and sync bodies; the outbox and relay carry it. Drivers' storage: the conformance suite.
from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Mapping

import pytest
import trio
import trio.testing

import jobs_trio
from jobs_trio._core import render as cli_render
from jobs_trio._core.errors import ConfigError, InvalidArgument
from jobs_trio.testing import memory_driver, new_worker, run_until_idle

tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)


@contextlib.contextmanager
def restore_tenant(context: Mapping[str, str]) -> Iterator[None]:
    token = tenant.set(context.get("tenant"))
    try:
        yield
    finally:
        tenant.reset(token)


def capture_tenant() -> dict[str, str] | None:
    current = tenant.get()
    return None if current is None else {"tenant": current}


def seen_registry(**hooks: object) -> tuple[jobs_trio.Registry, list[tuple[str, object, object]]]:
    """A registry whose jobs record what their body saw: ctx.context and the tenant variable."""
    registry = jobs_trio.Registry(**hooks)  # type: ignore[arg-type]
    seen: list[tuple[str, object, object]] = []

    @registry.job("ctx.async")
    async def in_trio(ctx: jobs_trio.JobContext, payload: object) -> None:
        seen.append(("async", dict(ctx.context), tenant.get()))

    @registry.job("ctx.sync")
    def in_thread(ctx: jobs_trio.JobContext, payload: object) -> None:
        seen.append(("sync", dict(ctx.context), tenant.get()))

    return registry, seen


async def test_the_restore_hook_sets_the_enqueues_context_around_async_and_sync_bodies() -> None:
    registry, seen = seen_registry(restore_context=restore_tenant)
    driver = memory_driver()
    context = {"tenant": "t1", "request": "r-42"}
    await registry.require("ctx.async").enqueue(driver, context=context)
    await registry.require("ctx.sync").enqueue(driver, context={"tenant": "t2"})
    await run_until_idle(new_worker(driver, registry))
    assert sorted(seen) == [
        ("async", context, "t1"),
        # A sync body runs in a thread: Trio copies the run's context variables into it.
        ("sync", {"tenant": "t2"}, "t2"),
    ]
    assert tenant.get() is None  # set around the bodies only, never in the test's own task


async def test_without_a_context_the_hook_gets_an_empty_one_and_nothing_is_stored() -> None:
    registry, seen = seen_registry(restore_context=restore_tenant)
    driver = memory_driver()
    job_id = await registry.require("ctx.async").enqueue(driver)
    empty = await registry.require("ctx.async").enqueue(driver, context={})
    await run_until_idle(new_worker(driver, registry))
    assert seen == [("async", {}, None), ("async", {}, None)]
    for stored in (job_id, empty):
        assert (await driver.get(stored)).context is None  # type: ignore[union-attr]


async def test_ctx_context_is_read_only() -> None:
    registry = jobs_trio.Registry()
    tried: list[BaseException] = []

    @registry.job("ctx.write")
    async def write(ctx: jobs_trio.JobContext, payload: object) -> None:
        try:
            ctx.context["tenant"] = "other"  # type: ignore[index]
        except TypeError as exc:
            tried.append(exc)

    driver = memory_driver()
    await write.enqueue(driver, context={"tenant": "t1"})
    [outcome] = await run_until_idle(new_worker(driver, registry))
    assert outcome.kind == "completed" and len(tried) == 1


async def test_the_capture_hook_supplies_the_context_an_enqueue_does_not_pass() -> None:
    captured = 0

    def capture() -> dict[str, str] | None:
        nonlocal captured
        captured += 1
        return capture_tenant()

    registry, seen = seen_registry(capture_context=capture, restore_context=restore_tenant)
    driver = memory_driver()
    job = registry.require("ctx.async")
    token = tenant.set("from-request")
    try:
        await job.enqueue(driver)  # captured
        await job.enqueue(driver, context={"tenant": "explicit"})  # given: no capture
        await job.enqueue_many(driver, [1, 2, 3])  # captured once for the batch
    finally:
        tenant.reset(token)
    await job.enqueue(driver)  # captured, outside any request: nothing
    assert captured == 3
    await run_until_idle(new_worker(driver, registry))
    assert sorted(str(t) for _, _, t in seen) == ["None", "explicit", *["from-request"] * 4]


async def test_a_restore_hook_that_raises_fails_the_attempt_like_its_body() -> None:
    def broken(context: Mapping[str, str]) -> contextlib.AbstractContextManager[None]:
        raise LookupError(f"no tenant {context['tenant']!r} here")

    registry, seen = seen_registry(restore_context=broken)
    driver = memory_driver()
    job_id = await registry.require("ctx.async").enqueue(driver, context={"tenant": "gone"})
    [outcome] = await new_worker(driver, registry).tick()
    assert outcome.kind == "retried" and seen == []
    assert (await driver.get(job_id)).last_error == "LookupError: no tenant 'gone' here"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("context", "argument"),
    [
        ("tenant=t1", "context"),
        ({"tenant": 1}, "context['tenant']"),
        ({"tenant": ""}, "context['tenant']"),
        ({"tenant": "a\x00b"}, "context['tenant']"),
        ({"tenant": "x" * 513}, "context['tenant']"),
        ({"": "t1"}, "context name"),
        ({"ten\nant": "t1"}, "context name"),
        ({"n" * 101: "t1"}, "context name"),
        ({f"k{n}": "v" for n in range(33)}, "context"),
        # The W3C names are jobs_trio's: its own trace context is stored under them.
        ({"traceparent": "00-abc"}, "context"),
    ],
)
async def test_a_context_is_checked_at_the_boundary_and_nothing_is_written(
    context: object, argument: str
) -> None:
    registry, _ = seen_registry()
    driver = memory_driver()
    with pytest.raises(InvalidArgument) as refused:
        await registry.require("ctx.async").enqueue(driver, context=context)  # type: ignore[arg-type]
    assert refused.value.argument == argument
    with pytest.raises(InvalidArgument):
        await registry.require("ctx.async").enqueue_many(driver, [1], context=context)  # type: ignore[arg-type]
    assert await driver.list_jobs() == []


async def test_a_capture_hooks_answer_is_checked_like_an_argument() -> None:
    registry, _ = seen_registry(capture_context=lambda: {"tenant": 42})
    with pytest.raises(InvalidArgument, match="context\\['tenant'\\]"):
        await registry.require("ctx.async").enqueue(memory_driver())


def test_a_hook_that_is_not_callable_is_refused_at_the_registry() -> None:
    with pytest.raises(ConfigError, match="restore_context"):
        jobs_trio.Registry(restore_context="tenant")  # type: ignore[arg-type]


async def test_the_stored_text_is_one_sorted_json_object(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry, _ = seen_registry()
    driver = memory_driver()
    job_id = await registry.require("ctx.async").enqueue(driver, context={"b": "2", "a": "1"})
    stored = (await driver.get(job_id)).context  # type: ignore[union-attr]
    assert stored == '{"a":"1","b":"2"}' and json.loads(stored) == {"a": "1", "b": "2"}


async def test_a_job_written_to_the_outbox_keeps_its_context_through_the_relay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    registry, seen = seen_registry(restore_context=restore_tenant)
    app, store = memory_driver(), memory_driver()
    await registry.require("ctx.async").enqueue(jobs_trio.Outbox(app), context={"tenant": "t9"})
    async with jobs_trio.open_relay(app, store, drain_on_shutdown=False) as relay:
        while relay.moved < 1:
            await trio.sleep(0.1)
    await run_until_idle(new_worker(store, registry))
    assert seen == [("async", {"tenant": "t9"}, "t9")]


async def test_show_prints_a_jobs_context_and_only_when_it_has_one() -> None:
    registry, _ = seen_registry()
    driver = memory_driver()
    with_one = await registry.require("ctx.async").enqueue(driver, context={"tenant": "t1"})
    without = await registry.require("ctx.async").enqueue(driver)
    now = driver.now()
    shown = cli_render.job_text(await driver.get(with_one), [], now)  # type: ignore[arg-type]
    assert 'context     {"tenant":"t1"}' in shown.splitlines()
    assert "context" not in cli_render.job_text(await driver.get(without), [], now)  # type: ignore[arg-type]
