# claim_ahead="auto", the default (issue 35): each queue claims ahead what its slots start in
# about 20 ms at the pace of its runs (longer, up to 80 ms, while its claims keep coming back
# full), nothing before a run has ended, nothing for long jobs, and never for a queue whose jobs
# take fleet slots; 0 turns it off.
from __future__ import annotations

from typing import Any

import pytest
import trio

from jobs_trio import ConfigError, FleetLimit, JobState, Registry
from jobs_trio._run.slots import AUTO_DEEP_HOLD, AUTO_HOLD
from jobs_trio._run.worker_options import AUTO_MAX
from tests.helpers.worker_helpers import record, worker
from tests.run.test_claim_loop import CountingDriver


def _timed(seconds: float, *, fleet_limit: FleetLimit | None = None) -> Registry:
    """Job ``q.job`` in queue ``q``: each run takes ``seconds`` of Trio's clock."""
    registry = Registry()

    @registry.job("q.job", queue="q", fleet_limit=fleet_limit)
    async def body(ctx: object, payload: Any) -> None:
        await trio.sleep(seconds)

    return registry


async def _run_all(registry: Registry, driver: CountingDriver, n: int, **options: Any) -> None:
    job = registry.get("q.job")
    assert job is not None
    ids = await job.enqueue_many(driver, list(range(n)))
    w = worker(driver, registry, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        with trio.fail_after(3600):
            while [(await record(driver, i)).state for i in ids] != [JobState.COMPLETED] * n:
                await trio.sleep(1)
        await w.stop()
    for job_id in ids:
        assert (await record(driver, job_id)).attempts == 1


def _asked(driver: CountingDriver) -> list[int]:
    asked = []
    for claim in driver.claims:
        assert isinstance(claim, dict)
        asked.append(claim["q"])
    return asked


async def test_short_jobs_are_claimed_ahead_once_their_pace_is_known(autojump_clock: Any) -> None:
    driver = CountingDriver()
    await _run_all(_timed(0.001), driver, 300, concurrency=2)
    asked = _asked(driver)
    # The first claim knows nothing of the jobs: only the free slots.
    assert asked[0] == 2
    # Once runs have ended (each held its slot 1 ms), what two slots start in a hold: AUTO_HOLD,
    # doubled by each claim in a row that came back full (300 waiting), AUTO_DEEP_HOLD at most.
    ahead, deepest = int(2 * AUTO_HOLD / 0.001), int(2 * AUTO_DEEP_HOLD / 0.001)
    assert 2 < ahead < deepest < AUTO_MAX
    assert asked[1] == 2 + 2 * ahead  # the first claim came back full
    assert max(asked) <= 2 + deepest
    # Held jobs, not a claim per job: a claim goes out once half of the room ahead has
    # started, or a quarter when it carries settlements (which a round trip writes anyway),
    # so about one claim per ahead / 4 jobs asked for all 300.
    total, claims = 0, 0
    while total < 300:
        total += asked[claims]
        claims += 1
    assert claims <= 300 // (ahead // 4) + 2


class _HoldingDriver(CountingDriver):
    """Records, after each claim, how many of its jobs are claimed (running or held)."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed_after: list[int] = []

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        claims = await super().claim(*args, **kwargs)
        (stats,) = await self.stats()
        self.claimed_after.append(stats.depth.get(JobState.RUNNING.value, 0))
        return claims


async def test_a_backlog_is_held_longer_and_a_stream_kept_up_with_is_not(
    autojump_clock: Any,
) -> None:
    # Behind a backlog, claims that keep coming back full grow the hold to AUTO_DEEP_HOLD: a
    # claim then covers the next one's round trip (at c=50 a 20 ms hold ran dry waiting for
    # it). Once the backlog is gone, one short answer brings it back to AUTO_HOLD: a job
    # enqueued into a stream the worker keeps up with waits behind 20 ms of held jobs, not 80.
    registry = _timed(0.001)
    job = registry.get("q.job")
    assert job is not None
    driver = _HoldingDriver()
    w = worker(driver, registry, concurrency=2)
    ids = list(await job.enqueue_many(driver, list(range(2000))))
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        while (await record(driver, ids[-1])).state is not JobState.COMPLETED:
            await trio.sleep(0.1)
        backlog = len(driver.claims)
        # Then a stream: 20 jobs every 0.1 s, which two slots of 1 ms runs keep up with.
        for _ in range(20):
            ids += await job.enqueue_many(driver, list(range(20)))
            await trio.sleep(0.1)
        while (await record(driver, ids[-1])).state is not JobState.COMPLETED:
            await trio.sleep(0.1)
        await w.stop()
    ahead, deepest = int(2 * AUTO_HOLD / 0.001), int(2 * AUTO_DEEP_HOLD / 0.001)
    # The two slots' jobs and up to `deepest` held for them.
    assert max(driver.claimed_after[:backlog]) == 2 + deepest
    # In the stream each claim comes back short (20 waiting, more asked): never more than 20
    # claimed at once, and every claim asks for what AUTO_HOLD sizes, not more.
    assert max(driver.claimed_after[backlog + 1 :]) <= 20
    assert max(_asked(driver)[backlog + 1 :]) <= 2 + ahead
    for job_id in ids:
        assert (await record(driver, job_id)).attempts == 1


async def test_jobs_whose_slots_start_fewer_than_one_a_hold_are_never_claimed_ahead(
    autojump_clock: Any,
) -> None:
    # Two slots of 0.2 s runs start one job every 0.1 s: none in a hold of 25 ms.
    driver = CountingDriver()
    await _run_all(_timed(0.2), driver, 30, concurrency=2)
    assert max(_asked(driver)) <= 2


async def test_claim_ahead_0_turns_it_off(autojump_clock: Any) -> None:
    driver = CountingDriver()
    await _run_all(_timed(0.001), driver, 50, concurrency=2, claim_ahead=0)
    assert max(_asked(driver)) <= 2


async def test_a_queue_whose_jobs_take_fleet_slots_is_not_claimed_ahead_by_default(
    autojump_clock: Any,
) -> None:
    # A held job would take its fleet slot at claim, before it runs, while a peer may idle.
    registry = _timed(0.001, fleet_limit=FleetLimit(100))
    driver = CountingDriver()
    w = worker(driver, registry, concurrency=2)
    assert w.options.auto_ahead == frozenset() and w.options.ahead == {"q": 0}
    await _run_all(registry, driver, 50, concurrency=2)
    assert max(_asked(driver)) <= 2
    # Asked for, it is claimed ahead all the same.
    w = worker(driver, registry, concurrency=2, claim_ahead=4)
    assert w.options.ahead == {"q": 4}


def test_auto_is_the_default_and_may_be_named_per_queue() -> None:
    registry = _timed(0.001)

    @registry.job("r.job", queue="r")
    async def other(ctx: object, payload: Any) -> None: ...

    driver = CountingDriver()
    assert worker(driver, registry).options.auto_ahead == {"q", "r"}
    mixed = worker(driver, registry, claim_ahead={"q": 3}).options
    assert (mixed.auto_ahead, mixed.ahead) == ({"r"}, {"q": 3, "r": AUTO_MAX})
    named = worker(driver, registry, claim_ahead={"q": "auto", "r": 0}).options
    assert (named.auto_ahead, named.ahead) == ({"q"}, {"q": AUTO_MAX, "r": 0})


@pytest.mark.parametrize("bad", ["fast", "AUTO ", {"q": "some"}])
def test_claim_ahead_refuses_words_other_than_auto(bad: Any) -> None:
    with pytest.raises(ConfigError, match="auto"):
        worker(CountingDriver(), _timed(0.001), claim_ahead=bad)
