# Fleet concurrency slots and rate records (issue 15), on every driver: a job whose limit is
# reached is not claimed (ready, uncounted, put off), a settle frees its slot, a dead holder's
# slot frees when its lease lapses, a stale settle frees nothing, a taken-over slot is reported.
from __future__ import annotations

import attrs

from jobs_trio._core.records import Complete, JobLimits, JobState, NewJob, Retry
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import new_job


def limited(
    slots: int = 0,
    *,
    key: str = "acct:1",
    starts: int = 0,
    per: float = 10.0,
    priority: int = 0,
    attempts: int = 3,
    name: str = "t.job",
) -> NewJob:
    limits = JobLimits(
        slot_key=key if slots else None,
        slots=slots,
        rate_key=key if starts else None,
        starts=starts,
        per=per,
    )
    job = new_job(name, priority=priority, attempts=attempts)
    return attrs.evolve(job, limits=limits)


async def ids_of(driver: Driver, jobs: list[NewJob]) -> list[str]:
    return [a.job_id for a in await driver.enqueue(jobs)]


async def test_a_full_slot_leaves_the_job_ready_uncounted_until_a_settle_frees_it(
    driver: Driver, manual_clock: ManualClock
) -> None:
    a, b, c = await ids_of(driver, [limited(2, priority=n) for n in range(3)])
    claims = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [x.job_id for x in claims] == [a, b]
    waiting = await driver.get(c)
    assert waiting is not None
    assert (waiting.state, waiting.attempts) == (JobState.READY, 0)
    assert waiting.run_at > driver.now()  # put off: the claim loop does not spin on it
    [stats] = await driver.stats()
    assert stats.limit_waiting == (("t.job", "slot", 1),)
    manual_clock.advance(1)
    assert await driver.claim(["default"], 10, lease=30, worker_id="w2") == []
    # The settle frees the slot in its own transaction and makes the waiting job due now.
    await driver.settle([Complete(claims[0].lease)])
    [again] = await driver.claim(["default"], 10, lease=30, worker_id="w2")
    assert (again.job_id, again.attempt) == (c, 1)
    [stats] = await driver.stats()
    assert stats.limit_waiting == ()


async def test_a_record_shows_its_limits_and_what_it_waits_for(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # `jobs-trio show` reads these: an operator asking why a ready job does not run.
    holder, waiter = await ids_of(driver, [limited(1, key="acct:7", priority=n) for n in (0, 1)])
    [plain] = await ids_of(driver, [new_job()])
    [rated] = await ids_of(driver, [limited(starts=5, per=60.0, key="api")])
    shown = await driver.get(waiter)
    assert shown is not None
    assert (shown.slot_key, shown.slots, shown.rate_key, shown.starts, shown.per) == (
        "acct:7",
        1,
        None,
        None,
        None,
    )
    assert shown.waiting_on is None  # not put off yet: no claim has looked at it
    rated_record = await driver.get(rated)
    assert rated_record is not None and rated_record.limits == JobLimits(
        rate_key="api", starts=5, per=60.0
    )
    unlimited = await driver.get(plain)
    assert unlimited is not None and unlimited.limits is None and unlimited.slots is None
    claims = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert {c.job_id for c in claims} == {holder, plain, rated}
    put_off = await driver.get(waiter)
    assert put_off is not None and put_off.waiting_on == "slot:acct:7"
    listed = {r.id: r for r in await driver.list_jobs(state=JobState.READY)}
    assert listed[waiter].waiting_on == "slot:acct:7"
    [held] = [c for c in claims if c.job_id == holder]
    await driver.settle([Complete(held.lease)])
    [claim] = await driver.claim(["default"], 10, lease=30, worker_id="w2")
    assert claim.job_id == waiter
    taken = await driver.get(waiter)
    assert taken is not None and taken.waiting_on is None  # claimed: no longer waiting


async def test_each_key_has_its_own_slots_and_unlimited_jobs_pass(driver: Driver) -> None:
    jobs = [limited(1, key="acct:1"), limited(1, key="acct:1"), limited(1, key="acct:2")]
    a, b, c = await ids_of(driver, jobs)
    [free] = await ids_of(driver, [new_job()])
    claimed = {x.job_id for x in await driver.claim(["default"], 10, lease=30, worker_id="w1")}
    # One of acct:1's two, acct:2's one, and the unlimited job.
    assert len(claimed) == 3 and {c, free} <= claimed and len(claimed & {a, b}) == 1


async def test_a_dead_holders_slot_frees_when_its_lease_lapses(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # The holder's worker dies on its last attempt: its lapse frees the slot, taken at once.
    holder, waiter = await ids_of(driver, [limited(1, attempts=1), limited(1, priority=1)])
    [claim] = await driver.claim(["default"], 10, lease=10, worker_id="w1")
    assert claim.job_id == holder
    manual_clock.advance(5)
    assert await driver.claim(["default"], 10, lease=10, worker_id="w2") == []
    manual_clock.advance(6)  # the holder's lease (and with it its slot) has lapsed
    [taken] = await driver.claim(["default"], 10, lease=10, worker_id="w2")
    if driver.capabilities.claims_alone:
        # Orphaned (rules.orphaning): handed back at its place, first in line, it takes the
        # freed slot again as its only attempt; the waiter has it once the holder ends.
        assert (taken.job_id, taken.attempt) == (holder, 1)
        assert await driver.claim(["default"], 10, lease=10, worker_id="w2") == []
        await driver.settle([Complete(taken.lease)])
        [taken] = await driver.claim(["default"], 10, lease=10, worker_id="w2")
    else:
        # Out of attempts: its lapse buries it, and its slot goes to the next job.
        dead = await driver.get(holder)
        assert dead is not None and dead.state is JobState.DEAD
    assert taken.job_id == waiter


async def test_renew_extends_the_slot_and_reports_one_taken_over(
    driver: Driver, manual_clock: ManualClock
) -> None:
    [first] = await ids_of(driver, [limited(1)])
    [claim] = await driver.claim(["default"], 1, lease=10, worker_id="w1")
    manual_clock.advance(8)
    renewed = await driver.renew([claim.lease], lease=10)
    assert claim.token in renewed.held and not renewed.slot_lost
    manual_clock.advance(8)  # within the renewed lease: the slot is still held
    [urgent] = await ids_of(driver, [limited(1, priority=-1)])
    assert await driver.claim(["default"], 1, lease=10, worker_id="w2") == []
    manual_clock.advance(3)  # the lease (and slot) lapsed; a claim of one takes the slot over
    # Taking no lapsed job (rescue=False, as a worker back from an outage claims): else the
    # claim hands the first job back orphaned (rules.orphaning) and its lease is gone too.
    keeps = driver.capabilities.rescue_on_request or not driver.capabilities.claims_alone
    rescue = not driver.capabilities.rescue_on_request
    [over] = await driver.claim(["default"], 1, lease=10, worker_id="w2", rescue=rescue)
    assert over.job_id == urgent
    # The first run's job lease is still its own (nobody claimed that job), its slot is not.
    lost = await driver.renew([claim.lease, over.lease], lease=10)
    if not keeps:
        assert lost.held == {over.token}
        return
    assert lost.held == {claim.token, over.token}
    assert lost.slot_lost == {claim.token}
    record = await driver.get(first)
    assert record is not None and record.state is JobState.RUNNING


async def test_a_stale_settle_releases_nothing(driver: Driver, manual_clock: ManualClock) -> None:
    job, other = await ids_of(driver, [limited(1), limited(1, priority=1)])
    [stale] = await driver.claim(["default"], 1, lease=10, worker_id="w1")
    manual_clock.advance(11)
    [current] = await driver.claim(["default"], 1, lease=10, worker_id="w2")
    assert current.job_id == job and current.token != stale.token
    # Fenced: the stale run's settle writes nothing, and frees the slot the current run holds.
    assert await driver.settle([Complete(stale.lease)]) == []
    assert await driver.claim(["default"], 5, lease=10, worker_id="w3") == []
    await driver.settle([Retry(current.lease, delay=100, error="again")])
    [then] = await driver.claim(["default"], 5, lease=10, worker_id="w3")
    assert then.job_id == other


async def test_a_rate_lets_n_start_per_window_and_puts_the_rest_off(
    driver: Driver, manual_clock: ManualClock
) -> None:
    ids = await ids_of(driver, [limited(starts=3, per=10.0, priority=n) for n in range(5)])
    first = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [c.job_id for c in first] == ids[:3]  # the burst: up to N at once
    for job_id in ids[3:]:
        record = await driver.get(job_id)
        assert record is not None
        assert (record.state, record.attempts) == (JobState.READY, 0)
        assert record.run_at == driver.now() + 10.0  # when the window's first start ages out
    [stats] = await driver.stats()
    assert stats.limit_waiting == (("t.job", "rate", 2),)
    # Settling does not give a start back: it is the starts that are limited, not the runs.
    await driver.settle([Complete(c.lease) for c in first])
    manual_clock.advance(9.9)
    assert await driver.claim(["default"], 10, lease=30, worker_id="w1") == []
    manual_clock.advance(0.1)
    later = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [c.job_id for c in later] == ids[3:]


async def test_a_settle_batch_freeing_two_slots_wakes_two_waiters(driver: Driver) -> None:
    ids = await ids_of(driver, [limited(2, priority=n) for n in range(4)])
    held = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [c.job_id for c in held] == ids[:2]
    await driver.settle([Complete(c.lease) for c in held])
    woken = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [c.job_id for c in woken] == ids[2:]


async def test_completions_settled_together_free_their_slots(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # Two holders of a two-slot key completed in one settle call: both slots free, and the two
    # jobs a claim put off are due at once (a driver that writes completions together must
    # still free each one's slot).
    a, b, c, d = await ids_of(driver, [limited(2, priority=n) for n in range(4)])
    claims = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [x.job_id for x in claims] == [a, b]
    manual_clock.advance(1)
    assert await driver.settle([Complete(x.lease) for x in claims]) == [a, b]
    again = await driver.claim(["default"], 10, lease=30, worker_id="w2")
    assert sorted(x.job_id for x in again) == sorted([c, d])
