# claim_ahead="auto", the default (issue 35): each queue claims ahead what its slots start in
# about 20 ms at the pace of its runs (behind a backlog, what covers its claims' round trips, up
# to 80 ms), nothing before a run has ended, nothing for long jobs, and never for a queue whose
# jobs take fleet slots; 0 turns it off.
from __future__ import annotations

from typing import Any

import pytest
import trio

from jobs_trio import ConfigError, FleetLimit, JobState, Registry
from jobs_trio._run.slots import AUTO_DEEP_HOLD, AUTO_HOLD, ROUND_TRIPS_HELD
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
    # Once runs have ended (each held its slot 1 ms), what two slots start in AUTO_HOLD (the
    # claims here come back at once: nothing longer to cover).
    ahead = int(2 * AUTO_HOLD / 0.001)
    assert 2 < ahead < AUTO_MAX
    assert max(asked) == 2 + ahead
    # Held jobs, not a claim per job: a claim goes out once half of the room ahead has
    # started, or a quarter when it carries settlements (which a round trip writes anyway),
    # so about one claim per ahead / 4 jobs asked for all 300.
    total, claims = 0, 0
    while total < 300:
        total += asked[claims]
        claims += 1
    assert claims <= 300 // (ahead // 4) + 2


class _SlowClaims(CountingDriver):
    """Each claim comes back ``round_trip`` seconds after it is sent, and records how many jobs
    are claimed (running or held) once it has."""

    def __init__(self, round_trip: float) -> None:
        super().__init__()
        self.round_trip = round_trip
        self.claimed_after: list[int] = []

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        await trio.sleep(self.round_trip)
        claims = await super().claim(*args, **kwargs)
        (stats,) = await self.stats()
        self.claimed_after.append(stats.depth.get(JobState.RUNNING.value, 0))
        return claims


async def _completed(driver: CountingDriver, n: int) -> None:
    while True:
        (stats,) = await driver.stats()
        if stats.depth.get(JobState.COMPLETED.value, 0) == n:
            return
        await trio.sleep(0.1)


async def _backlog_then_stream(
    driver: _SlowClaims, registry: Registry, backlog: int, **options: Any
) -> tuple[int, list[str]]:
    """``backlog`` jobs at once, then a stream of 20 jobs every 0.1 s for 2 s; answers how many
    claims the backlog took, and every job's id (each then checked to have run once)."""
    job = registry.get("q.job")
    assert job is not None
    w = worker(driver, registry, concurrency=2, **options)
    ids = list(await job.enqueue_many(driver, list(range(backlog))))
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await _completed(driver, len(ids))
        claims = len(driver.claims)
        for _ in range(20):
            ids += await job.enqueue_many(driver, list(range(20)))
            await trio.sleep(0.1)
        await _completed(driver, len(ids))
        await w.stop()
    for job_id in ids:
        assert (await record(driver, job_id)).attempts == 1
    return claims, ids


async def test_a_backlog_is_held_for_its_claims_round_trips_and_a_stream_is_not(
    autojump_clock: Any,
) -> None:
    # Behind a backlog (each claim comes back full) a queue holds what covers ROUND_TRIPS_HELD
    # of its claims' round trips: with 20 ms claims and 20 ms held, the worker ran dry waiting
    # for each. Once the backlog is gone its claims come back short, and it holds AUTO_HOLD
    # again: a job enqueued into a stream the worker keeps up with waits behind 20 ms of held
    # jobs, whatever its claims' round trips.
    driver = _SlowClaims(0.02)
    backlog, _ = await _backlog_then_stream(driver, _timed(0.001), 2000)
    ahead = int(2 * AUTO_HOLD / 0.001)
    covering = int(2 * ROUND_TRIPS_HELD * 0.02 / 0.001)
    assert ahead < covering < int(2 * AUTO_DEEP_HOLD / 0.001)
    # The two slots' jobs and, once the round trip is known, up to `covering` held for them.
    assert 2 + ahead < max(driver.claimed_after[:backlog]) <= 2 + covering
    # In the stream each claim comes back short (20 waiting, more asked): never more than 20
    # claimed at once, and every claim asks for what AUTO_HOLD sizes, not more.
    assert max(driver.claimed_after[backlog + 1 :]) <= 20
    assert max(_asked(driver)[backlog + 1 :]) <= 2 + ahead


async def test_the_hold_stays_under_half_the_hold_limit(autojump_clock: Any) -> None:
    # Held past its hold limit, a job is handed back to the table, where the next claim (full:
    # the backlog is still there) takes it again. A hold limit of 50 ms set by hand caps the
    # hold at 25 ms, so none is held that long (claims of 30 ms would hold 80).
    driver = _SlowClaims(0.03)
    await _backlog_then_stream(driver, _timed(0.001), 2000, hold_limit=0.05)
    assert len(driver.claimed) == len(set(driver.claimed))
    assert max(driver.claimed_after) <= 2 + int(2 * 0.025 / 0.001)


async def test_jobs_too_long_to_claim_ahead_are_not_claimed_ahead_behind_a_backlog(
    autojump_clock: Any,
) -> None:
    # Two slots of 50 ms runs start one job every 25 ms, fewer than one in AUTO_HOLD: a held
    # one would wait for a whole run, however long the claims' round trips.
    driver = _SlowClaims(0.03)
    await _backlog_then_stream(driver, _timed(0.05), 60)
    assert max(driver.claimed_after) <= 2


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
