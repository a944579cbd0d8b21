# step.transaction on SQLite and PostgreSQL, in one process: a step's rows, enqueues and events
# commit with its record or not at all, a replay skips it, a run that lost its claim commits
# nothing (fenced by the token, however late its own clock is to notice), and it is refused
# where it cannot hold (the memory driver, inside another transaction, a sync function).
# step.key: one idempotency key per step of a job, the same on every attempt.
from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio import Backoff, Registry, Transaction
from jobs_trio._core.errors import Aborted
from jobs_trio._core.records import JobState, StepStatus
from jobs_trio._run.run_scope import CancelReason, RunScope
from jobs_trio._run.steps import Steps
from jobs_trio.driver import Driver
from jobs_trio.testing import ManualClock
from jobs_trio.testing.conformance.helpers import claim_one
from tests.conftest import require_postgres
from tests.helpers.worker_helpers import record, trio_driver, worker

NOW_AGAIN = Backoff(base=0.0, jitter=0.0)  # a retry due at once: no waiting in these tests


@contextlib.asynccontextmanager
async def job_store(
    kind: str, tmp_path: Path, clock: Callable[[], float] | None = None
) -> AsyncIterator[Driver]:
    """A SQLite or PostgreSQL job store with an application table in it, ``app_rows``."""
    options: dict[str, Any] = {} if clock is None else {"clock": clock}
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        url = require_postgres()
        schema = f"jt_{uuid.uuid4().hex[:12]}"
        options.update(schema=schema, migrate=True, drop_schema_on_close=True)
    async with jobs_trio.open_driver(url, **options) as driver:
        async with jobs_trio.transaction(driver) as tx:
            await tx.execute(f"CREATE TABLE {rows_table(driver)} (step text, attempt integer)")
        yield driver


def rows_table(driver: Driver) -> str:
    schema = getattr(driver, "schema", None)  # PostgreSQL: the test's own schema, dropped after
    return "app_rows" if schema is None else f'"{schema}".app_rows'


def placeholders(driver: Driver, n: int) -> str:
    return ", ".join(("?" if driver.url.startswith("sqlite") else f"${i}") for i in range(1, n + 1))


async def insert_row(tx: Transaction, driver: Driver, step: str, attempt: int) -> str:
    await tx.execute(
        f"INSERT INTO {rows_table(driver)} (step, attempt) VALUES ({placeholders(driver, 2)})",
        step,
        attempt,
    )
    return step


async def rows(driver: Driver) -> list[tuple[str, int]]:
    async with jobs_trio.transaction(driver) as tx:
        found = await tx.fetch(f"SELECT step, attempt FROM {rows_table(driver)} ORDER BY step")
    return [(r[0], r[1]) for r in found]


STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("kind", STORES)
async def test_a_step_commits_its_row_with_its_record_and_a_replay_skips_it(
    kind: str, tmp_path: Path
) -> None:
    registry = Registry()
    calls: list[str] = []

    async def counted(tx: Transaction, driver: Driver, step: str, attempt: int) -> str:
        calls.append(step)
        return await insert_row(tx, driver, step, attempt)

    async with job_store(kind, tmp_path) as driver:

        @registry.job("rows", timeout=None)
        async def two_rows(ctx: jobs_trio.JobContext, payload: None) -> list[str]:
            first = await ctx.step.transaction("first", counted, driver, "first", ctx.attempt)
            await ctx.step.wait_for_event("go", "go")  # suspends: the next run replays "first"
            second = await ctx.step.transaction("second", counted, driver, "second", ctx.attempt)
            return [first, second]

        job_id = await two_rows.enqueue(driver)
        w = worker(driver, registry)
        assert [o.kind for o in await w.tick()] == ["suspended"]
        assert await rows(driver) == [("first", 1)]
        await jobs_trio.send_event(driver, "go", {})
        assert [o.kind for o in await w.tick()] == ["completed"]
        assert calls == ["first", "second"]
        assert await rows(driver) == [("first", 1), ("second", 1)]
        done = await record(driver, job_id)
        assert done.result == ["first", "second"]
        steps = {s.name: s for s in await driver.load_steps(job_id)}
        assert steps["first"].result == '"first"' and steps["second"].status is StepStatus.DONE


@pytest.mark.parametrize("kind", STORES)
async def test_a_step_that_fails_leaves_no_row_enqueue_or_event_and_its_retry_writes_them_once(
    kind: str, tmp_path: Path
) -> None:
    registry = Registry()

    @registry.job("notified")
    async def notified(ctx: jobs_trio.JobContext, payload: None) -> None:
        pass

    async with job_store(kind, tmp_path) as driver:

        async def effects(tx: Transaction, attempt: int) -> str:
            await insert_row(tx, driver, "effects", attempt)
            # Neither names the transaction: both join the step's, as any enqueue in a block.
            follow_up = await notified.enqueue(driver, key=f"follow-up:{attempt}")
            await jobs_trio.send_event(driver, "row.written", {"attempt": attempt})
            if attempt == 1:
                raise ConnectionError("the step failed after its writes")
            return follow_up

        @registry.job("writer", attempts=3, backoff=NOW_AGAIN, timeout=None)
        async def writer(ctx: jobs_trio.JobContext, payload: None) -> str:
            return await ctx.step.transaction("effects", effects, ctx.attempt)

        job_id = await writer.enqueue(driver)
        w = worker(driver, registry, queues=["default"])
        assert [o.kind for o in await w.tick()] == ["retried"]
        assert await rows(driver) == []
        assert [j.name for j in await driver.list_jobs()] == ["writer"]
        look = await driver.look_for_event("row.written", key=None, since=None)
        assert look.found is None
        assert await driver.load_steps(job_id) == []
        assert [o.kind for o in await w.tick()] == ["completed"]
        assert await rows(driver) == [("effects", 2)]
        done = await record(driver, job_id)
        follow_up = await record(driver, done.result)
        assert (follow_up.name, follow_up.key) == ("notified", "follow-up:2")
        look = await driver.look_for_event("row.written", key=None, since=None)
        assert look.found is not None and look.found.payload == '{"attempt":2}'


@pytest.mark.parametrize("kind", STORES)
async def test_a_run_whose_claim_was_taken_over_commits_nothing_and_is_lost(
    kind: str, tmp_path: Path, manual_clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # The zombie: its own clock has not noticed (its run scope is not cancelled), so only the
    # token, checked in the step's transaction, stands between it and a second row.
    registry = Registry()

    @registry.job("zombie")
    async def zombie(ctx: jobs_trio.JobContext, payload: None) -> None: ...

    async with job_store(kind, tmp_path, clock=manual_clock) as driver:
        job_id = await zombie.enqueue(driver)
        paused = await claim_one(driver, lease=10)
        manual_clock.advance(11)
        current = await claim_one(driver, lease=10)
        caplog.clear()  # the take-over's jobs.attempt.orphaned: not this test's line
        run = RunScope(paused, None)
        calls: list[int] = []

        async def write(tx: Transaction) -> str:
            calls.append(1)
            return await insert_row(tx, driver, "write", paused.attempt)

        with (
            caplog.at_level(logging.WARNING, logger="jobs_trio"),
            run.cancel_scope,
            pytest.raises(Aborted, match="its transaction was rolled back"),
        ):
            await Steps(driver, paused.lease, zombie, run).transaction("write", write)
        assert calls == [1]  # it ran: the database refused its commit
        assert run.reason is CancelReason.LEASE_LOST
        assert [r.event for r in caplog.records] == ["jobs.step.fenced"]  # type: ignore[attr-defined]
        assert await rows(driver) == []
        assert await driver.load_steps(job_id) == []
        # The worker that holds the job now writes the step, once.
        now_run = RunScope(current, None)
        with now_run.cancel_scope:
            steps = Steps(driver, current.lease, zombie, now_run)
            assert await steps.transaction("write", write) == "write"
        assert await rows(driver) == [("write", 1)]
        assert [s.name for s in await driver.load_steps(job_id)] == ["write"]


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize(
    "reason", [CancelReason.LEASE_LOST, CancelReason.OPERATOR, CancelReason.DRAINING]
)
async def test_a_run_cancelled_during_the_step_commits_nothing(
    kind: str, tmp_path: Path, reason: CancelReason
) -> None:
    # Told while the step's function runs: a lost lease or an operator's cancel refuses the
    # record though the function returns at once; a drain cuts it at its next await. Either
    # way the transaction rolls back and the next attempt runs the step again.
    registry = Registry()

    @registry.job("told")
    async def told(ctx: jobs_trio.JobContext, payload: None) -> None: ...

    async with job_store(kind, tmp_path) as driver:
        job_id = await told.enqueue(driver)
        claim = await claim_one(driver)
        run = RunScope(claim, None)

        async def write(tx: Transaction) -> str:
            await insert_row(tx, driver, "write", 1)
            run.cancel(reason)
            if reason is CancelReason.DRAINING:
                await trio.sleep(0)  # the drain is heard at the next await
            return "written"

        # Refused at its record (Aborted: the body unwinds, judged by the scope's reason), or
        # cut at the await (Cancelled, which the run scope catches).
        refused = reason is not CancelReason.DRAINING
        with pytest.raises(Aborted) if refused else contextlib.nullcontext(), run.cancel_scope:
            await Steps(driver, claim.lease, told, run).transaction("write", write)
        assert run.reason is reason
        assert await rows(driver) == []
        assert await driver.load_steps(job_id) == []


async def test_a_transaction_step_past_its_step_timeout_names_the_step_and_commits_nothing(
    tmp_path: Path,
) -> None:
    registry = Registry()

    async def slow(tx: Transaction, driver: Driver) -> str:
        await insert_row(tx, driver, "slow", 1)
        await trio.sleep(30)
        return "never"

    async with job_store("sqlite", tmp_path) as driver:

        @registry.job("slowtx", step_timeout=0.05, timeout=None, attempts=1)
        async def slowtx(ctx: jobs_trio.JobContext, payload: None) -> None:
            await ctx.step.transaction("s", slow, driver)

        job_id = await slowtx.enqueue(driver)
        assert [o.kind for o in await worker(driver, registry).tick()] == ["dead-lettered"]
        error = (await record(driver, job_id)).last_error or ""
        assert "TooSlowError: step 's' ran past its step_timeout of 0.05 s" in error
        assert await rows(driver) == [] and await driver.load_steps(job_id) == []


async def test_step_transaction_is_refused_where_it_cannot_hold(tmp_path: Path) -> None:
    registry = Registry()

    async def write(tx: Transaction) -> None:
        await tx.execute("SELECT 1")

    def not_async(tx: Transaction) -> None:
        pass

    @registry.job("on-memory", attempts=1)
    async def on_memory(ctx: jobs_trio.JobContext, payload: None) -> None:
        await ctx.step.transaction("write", write)

    memory = trio_driver()
    job_id = await on_memory.enqueue(memory)
    [outcome] = await worker(memory, registry).tick()
    assert outcome.kind == "dead-lettered"
    error = (await record(memory, job_id)).last_error or ""
    assert error.startswith("ConfigError: [X_CONFIG]")
    assert "MemoryDriver has none" in error and "step.key" in error

    async with job_store("sqlite", tmp_path) as driver:

        @registry.job("nested", attempts=5)
        async def nested(ctx: jobs_trio.JobContext, payload: None) -> None:
            async with jobs_trio.transaction(driver):
                await ctx.step.transaction("write", write)

        @registry.job("sync-fn", attempts=5)
        async def sync_fn(ctx: jobs_trio.JobContext, payload: None) -> None:
            await ctx.step.transaction("write", not_async)  # type: ignore[arg-type]

        async def with_a_step_inside(tx: Transaction, ctx: jobs_trio.JobContext) -> None:
            await insert_row(tx, driver, "outer", ctx.attempt)
            await ctx.step.run("inner", trio.sleep, 0)

        @registry.job("step-inside", attempts=5)
        async def step_inside(ctx: jobs_trio.JobContext, payload: None) -> None:
            await ctx.step.transaction("outer", with_a_step_inside, ctx)

        ids = [await j.enqueue(driver) for j in (nested, sync_fn, step_inside)]
        outcomes = await worker(driver, registry, queues=["default"]).tick()
        # A StepError is terminal: dead at once, not retried four more times.
        assert [o.kind for o in outcomes] == ["dead-lettered"] * 3
        errors = [(await record(driver, i)).last_error or "" for i in ids]
        assert "inside an open jobs_trio.transaction" in errors[0]
        assert "which is not async" in errors[1]
        assert "called inside the function of step.transaction('outer')" in errors[2]
        assert [await driver.load_steps(i) for i in ids] == [[], [], []]
        assert await rows(driver) == []


@pytest.mark.parametrize("kind", STORES)
async def test_a_step_beside_a_transactional_one_is_not_inside_it(
    kind: str, tmp_path: Path
) -> None:
    # Two tasks of one body: the step.run of the other task runs while the transaction is
    # open (the transaction waits for it), and records itself on its own.
    registry = Registry()
    ran = trio.Event()

    async with job_store(kind, tmp_path) as driver:

        async def write(tx: Transaction) -> str:
            await insert_row(tx, driver, "write", 1)
            await ran.wait()
            return "written"

        async def beside() -> str:
            ran.set()
            return "beside"

        @registry.job("two-tasks")
        async def two_tasks(ctx: jobs_trio.JobContext, payload: None) -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ctx.step.transaction, "write", write)
                nursery.start_soon(ctx.step.run, "beside", beside)

        job_id = await two_tasks.enqueue(driver)
        assert [o.kind for o in await worker(driver, registry).tick()] == ["completed"]
        assert await rows(driver) == [("write", 1)]
        assert {s.name for s in await driver.load_steps(job_id)} == {"write", "beside"}


async def test_step_key_is_the_same_on_every_attempt_and_differs_by_step_and_job() -> None:
    registry = Registry()
    keys: dict[tuple[str, int], list[str]] = {}

    @registry.job("pay", attempts=2, backoff=NOW_AGAIN)
    async def pay(ctx: jobs_trio.JobContext, payload: None) -> None:
        keys[(ctx.job_id, ctx.attempt)] = [ctx.step.key("charge"), ctx.step.key("refund")]
        if ctx.attempt == 1:
            raise ConnectionError("the provider timed out")

    driver = trio_driver()
    first, second = await pay.enqueue(driver), await pay.enqueue(driver)
    w = worker(driver, registry)
    while len(keys) < 4:
        await w.tick()
    assert keys[(first, 1)] == keys[(first, 2)]
    assert keys[(second, 1)] == keys[(second, 2)]
    every = [k for attempt in ((first, 1), (second, 1)) for k in keys[attempt]]
    assert len(set(every)) == 4
    assert all(str(uuid.UUID(k)) == k for k in every)
    assert (await record(driver, first)).state is JobState.COMPLETED


@pytest.mark.parametrize("kind", STORES)
async def test_a_block_opened_inside_the_steps_function_is_refused(
    kind: str, tmp_path: Path
) -> None:
    # Its own block commits apart from the step (PostgreSQL: another connection of the pool):
    # the row it wrote would stay when the step rolls back, and be written again by the retry.
    registry = Registry()

    async with job_store(kind, tmp_path) as driver:

        async def nested(tx: Transaction, attempt: int) -> None:
            async with jobs_trio.transaction(driver) as inner:
                await insert_row(inner, driver, "nested", attempt)

        @registry.job("nested-block", attempts=3, backoff=NOW_AGAIN)
        async def nested_block(ctx: jobs_trio.JobContext, payload: None) -> None:
            await ctx.step.transaction("write", nested, ctx.attempt)

        job_id = await nested_block.enqueue(driver)
        assert [o.kind for o in await worker(driver, registry).tick()] == ["dead-lettered"]
        error = (await record(driver, job_id)).last_error or ""
        assert "opened inside the function of step.transaction('write')" in error
        assert await rows(driver) == []
