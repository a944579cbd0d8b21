# Property: whatever the sequence of steps and sleeps, and wherever drains interrupt it, a step
# whose record exists never runs again, and every job ends completed.
from __future__ import annotations

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jobs_trio
from jobs_trio import Registry
from jobs_trio._core.records import JobState, StepStatus
from tests.helpers.worker_helpers import record, trio_driver, worker

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("step"), st.sampled_from([0.0, 1.0, 7.0])),
        st.tuples(st.just("sleep"), st.sampled_from([0.5, 30.0, 3600.0])),
    ),
    min_size=1,
    max_size=8,
)
INTERRUPTIONS = st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0, 8.0, 40.0]), max_size=6)


# The mock clock carries on from one example to the next; nothing here depends on its origin.
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=OPS, interruptions=INTERRUPTIONS)
async def test_recorded_steps_never_run_again_and_every_job_completes(
    autojump_clock: object, plan: list[tuple[str, float]], interruptions: list[float]
) -> None:
    driver = trio_driver()
    registry = Registry()
    violations: list[str] = []
    runs: list[str] = []

    @registry.job("plan", timeout=None, event_poll=10)
    async def run_plan(ctx: jobs_trio.JobContext, payload: None) -> int:
        for index, (op, seconds) in enumerate(plan):
            name = f"{op}-{index}"
            if op == "sleep":
                await ctx.step.sleep(name, seconds)
                continue

            async def body(name: str = name, seconds: float = seconds) -> str:
                recorded = {s.name: s for s in await driver.load_steps(ctx.job_id)}
                if name in recorded and recorded[name].status is StepStatus.DONE:
                    violations.append(f"{name} ran again after it was recorded")
                runs.append(name)
                await trio.sleep(seconds)
                return name

            await ctx.step.run(name, body)
        return len(plan)

    job_id = await run_plan.enqueue(driver)
    for delay in interruptions:
        w = worker(driver, registry)
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.sleep(delay)
            w.accept("SIGTERM")
            await w.stop()
        between = await record(driver, job_id)
        if between.state is not JobState.COMPLETED:
            assert between.attempts == 0  # neither a drain nor a sleep counts
    last = worker(driver, registry)
    with trio.fail_after(len(plan) * 4000 + 100):
        async with trio.open_nursery() as nursery:
            await nursery.start(last.run)
            while (await record(driver, job_id)).state is not JobState.COMPLETED:
                await trio.sleep(60)
            await last.stop()
    assert violations == []
    done = await record(driver, job_id)
    assert done.result == len(plan) and done.attempts == 1
    steps = [
        name for name in (f"{op}-{i}" for i, (op, _) in enumerate(plan)) if name.startswith("step")
    ]
    assert set(runs) == set(steps)
