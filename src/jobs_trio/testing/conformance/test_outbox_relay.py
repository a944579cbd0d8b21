# The outbox half of the driver contract (outbox_write / claim / delete / present / stats /
# source) and the relay's decisions (relay_enqueue / forget / decisions, relay_in_place) and
# tickets (relay_ticket: the fence), on every driver: what the relay's exactly-once rests on,
# pruning, crashes and a relay paused past its lease included.
from __future__ import annotations

import attrs
import pytest

from jobs_trio._core.errors import ConfigError, RelayFenced
from jobs_trio._core.records import (
    Complete,
    JobLimits,
    NewJob,
    PruneTurn,
    RelayDecision,
    RelayHold,
    RelayOutcome,
)
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .fixtures import DriverFactory
from .helpers import claim_one, new_job, relay_write, take_rows

SOURCE = "outbox-a"


async def test_outbox_rows_are_claimed_oldest_first_with_what_remains_of_their_delay(
    driver: Driver, manual_clock: ManualClock
) -> None:
    first, second = new_job(payload={"n": 1}, delay=10.0, key="k1"), new_job(payload={"n": 2})
    await driver.outbox_write([first, second])
    manual_clock.advance(4.0)
    taken = (await take_rows(driver, 10, lease=30.0, relay_id="r1")).jobs
    assert [j.job_id for j in taken] == [first.job_id, second.job_id]
    assert taken[0].delay == 6.0 and taken[1].delay == 0.0
    assert (taken[0].key, taken[0].payload, taken[0].name) == ("k1", first.payload, first.name)
    assert taken[0].max_attempts == first.max_attempts


async def test_a_held_row_is_skipped_until_its_lease_lapses(
    driver: Driver, manual_clock: ManualClock
) -> None:
    rows = [new_job(payload={"n": n}) for n in range(3)]
    await driver.outbox_write(rows)
    first = (await take_rows(driver, 2, lease=30.0, relay_id="r1")).jobs
    second = (await take_rows(driver, 10, lease=30.0, relay_id="r2")).jobs
    assert [j.job_id for j in first] == [rows[0].job_id, rows[1].job_id]
    assert [j.job_id for j in second] == [rows[2].job_id]
    assert (await take_rows(driver, 10, lease=30.0, relay_id="r3")).jobs == ()
    manual_clock.advance(30.0)  # r1 and r2 died holding them: their rows come back
    again = (await take_rows(driver, 10, lease=30.0, relay_id="r3")).jobs
    assert [j.job_id for j in again] == [r.job_id for r in rows]


async def test_delete_and_stats(driver: Driver, manual_clock: ManualClock) -> None:
    empty = await driver.outbox_stats()
    assert (empty.pending, empty.oldest_age) == (0, None)
    rows = [new_job(), new_job()]
    await driver.outbox_write(rows[:1])
    manual_clock.advance(5.0)
    await driver.outbox_write(rows[1:])
    manual_clock.advance(2.0)
    stats = await driver.outbox_stats()
    assert (stats.pending, stats.oldest_age) == (2, 7.0)
    assert await driver.outbox_delete([rows[0].job_id, "no-such-id"]) == [rows[0].job_id]
    assert await driver.outbox_delete([rows[0].job_id]) == []
    stats = await driver.outbox_stats()
    assert (stats.pending, stats.oldest_age) == (1, 2.0)


async def test_an_outbox_row_keeps_its_fleet_limits_and_context(driver: Driver) -> None:
    limits = JobLimits(slot_key="acct:1", slots=2, rate_key="acct:1", starts=5, per=60.0)
    slotted = attrs.evolve(new_job(), limits=JobLimits(slot_key="s", slots=1), context='{"a":"b"}')
    both, plain = attrs.evolve(new_job(), limits=limits), new_job()
    await driver.outbox_write([slotted, both, plain])
    taken = (await take_rows(driver, 10, lease=30.0, relay_id="r1")).jobs
    assert [(t.limits, t.context) for t in taken] == [
        (JobLimits(slot_key="s", slots=1), '{"a":"b"}'),
        (limits, None),
        (None, None),
    ]


async def finish_and_prune(driver: Driver, clock: ManualClock, queue: str = "default") -> None:
    """Run the queue's one job to completion, then prune every finished job."""
    claim = await claim_one(driver, queue)
    assert await driver.settle([Complete(claim.lease)]) == [claim.job_id]
    clock.advance(10.0)
    pruned = await driver.prune(PruneTurn("p", keep_finished=1.0, keep_dead=1.0))
    assert pruned.deleted >= 1
    assert await driver.get(claim.job_id) is None


async def test_a_row_taken_again_after_its_job_finished_and_was_pruned_is_not_written_again(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job = new_job(payload={"n": 1})
    [first] = await relay_write(driver, [job], source=SOURCE)
    assert first == RelayDecision(
        job.job_id, RelayOutcome.CREATED, job.job_id, manual_clock.now, already=False
    )
    await finish_and_prune(driver, manual_clock)
    # The relay died before deleting the row; another takes it: answered from the record.
    [again] = await relay_write(driver, [job], source=SOURCE)
    assert again == attrs.evolve(first, already=True)
    assert await driver.get(job.job_id) is None
    assert await driver.list_jobs() == []


async def one_row_written(driver: Driver) -> tuple[NewJob, str]:
    """One row written to the outbox, and the job store's source a relay of it writes under
    (the same driver here)."""
    row = new_job()
    await driver.outbox_write([row])
    return row, await driver.outbox_source()


async def a_live_job_holding(driver: Driver, key: str) -> NewJob:
    """A job written straight to the job store, ready, holding ``key``: what a relayed row of
    that key meets."""
    holder = new_job(key=key)
    await driver.enqueue([holder])
    return holder


async def test_a_key_held_row_stays_a_no_op_after_its_holder_finished(
    driver: Driver, manual_clock: ManualClock
) -> None:
    holder = await a_live_job_holding(driver, "order:1")
    row = new_job(key="order:1")
    [decided] = await relay_write(driver, [row], source=SOURCE)
    assert (decided.outcome, decided.holder, decided.already) == (
        RelayOutcome.KEY_HELD,
        holder.job_id,
        False,
    )
    assert await driver.get(row.job_id) is None
    await finish_and_prune(driver, manual_clock)  # the key is free now
    [again] = await relay_write(driver, [row], source=SOURCE)
    assert again == attrs.evolve(decided, already=True)
    assert await driver.list_jobs() == []  # no job for the row, then or now


async def test_relay_enqueue_applies_unique_keys_and_delays_in_order(
    driver: Driver, manual_clock: ManualClock
) -> None:
    holder = await a_live_job_holding(driver, "order:1")
    keyed, delayed, second = new_job(key="order:1"), new_job(delay=30.0), new_job(key="k2")
    twin = new_job(key="k2")  # its key is taken by `second`, earlier in the same batch
    answers = await relay_write(driver, [keyed, delayed, second, twin], source=SOURCE)
    assert [(a.job_id, a.outcome, a.holder) for a in answers] == [
        (keyed.job_id, RelayOutcome.KEY_HELD, holder.job_id),
        (delayed.job_id, RelayOutcome.CREATED, delayed.job_id),
        (second.job_id, RelayOutcome.CREATED, second.job_id),
        (twin.job_id, RelayOutcome.KEY_HELD, second.job_id),
    ]
    record = await driver.get(delayed.job_id)
    assert record is not None and record.run_at == manual_clock.now + 30.0
    # A batch mixing decided rows and a new one answers each in order.
    fresh = new_job()
    answers = await relay_write(driver, [delayed, keyed, fresh], source=SOURCE)
    assert [(a.job_id, a.outcome, a.already) for a in answers] == [
        (delayed.job_id, RelayOutcome.CREATED, True),
        (keyed.job_id, RelayOutcome.KEY_HELD, True),
        (fresh.job_id, RelayOutcome.CREATED, False),
    ]
    assert len(await driver.list_jobs()) == 4


async def test_a_relayed_job_keeps_its_fleet_limits(driver: Driver) -> None:
    capped = [
        attrs.evolve(new_job(queue="capped"), limits=JobLimits(slot_key="acct", slots=1))
        for _ in range(2)
    ]
    await relay_write(driver, capped, source=SOURCE)
    claims = await driver.claim(["capped"], 10, lease=30.0, worker_id="w")
    assert len(claims) == 1  # one slot: the second waits, as a direct enqueue's would
    record = await driver.get(capped[1].job_id)
    assert record is not None and record.slot_key == "acct" and record.slots == 1


async def test_decisions_are_listed_by_age_and_forgotten_per_outbox(
    driver: Driver, manual_clock: ManualClock
) -> None:
    older, newer, theirs = new_job(), new_job(), new_job()
    await relay_write(driver, [older], source=SOURCE)
    manual_clock.advance(5.0)
    await relay_write(driver, [newer], source=SOURCE)
    await relay_write(driver, [theirs], source="outbox-b")
    now = manual_clock.now
    assert await driver.relay_decisions(SOURCE, before=now + 1, limit=10) == [
        older.job_id,
        newer.job_id,
    ]
    assert await driver.relay_decisions(SOURCE, before=now, limit=10) == [older.job_id]
    assert await driver.relay_decisions(SOURCE, before=now + 1, limit=1) == [older.job_id]
    # Another outbox's decision is neither listed nor forgotten under this one's name.
    assert await driver.relay_forget(SOURCE, [older.job_id, theirs.job_id]) == 1
    assert await driver.relay_decisions("outbox-b", before=now + 1, limit=10) == [theirs.job_id]
    assert await driver.relay_decisions(SOURCE, before=now + 1, limit=10) == [newer.job_id]
    # Forgotten, a row is decided afresh: the record is what stood between it and a second job.
    [anew] = await relay_write(driver, [older], source=SOURCE)
    assert (anew.outcome, anew.already) == (RelayOutcome.CREATED, True)  # its job is still there


async def test_outbox_present_and_source(
    driver: Driver, driver_factory: DriverFactory, manual_clock: ManualClock
) -> None:
    rows = [new_job(), new_job()]
    await driver.outbox_write(rows)
    await driver.outbox_delete([rows[0].job_id])
    asked = [rows[0].job_id, rows[1].job_id, "no-such-id"]
    assert await driver.outbox_present(asked) == [rows[1].job_id]
    source = await driver.outbox_source()
    assert isinstance(source, str) and source and await driver.outbox_source() == source
    assert await driver.shares_outbox(driver)


async def test_an_outbox_of_another_driver_is_moved_in_place_only_when_it_is_shared(
    driver: Driver, driver_factory: DriverFactory, manual_clock: ManualClock
) -> None:
    # Another driver of the factory: another file or store, or (PostgreSQL) another schema of
    # the same database, whose outbox this driver's connection reaches: then shared.
    async with driver_factory(manual_clock) as other:
        assert await other.outbox_source() != await driver.outbox_source()
        mine, theirs = new_job(), new_job()
        await driver.outbox_write([mine])
        await other.outbox_write([theirs])
        if not await driver.shares_outbox(other):
            with pytest.raises(ConfigError, match="another database"):
                await driver.relay_in_place(other, 10)
            assert await other.outbox_present([theirs.job_id]) == [theirs.job_id]
            return
        [moved] = await driver.relay_in_place(other, 10)
        assert (moved.job_id, moved.outcome) == (theirs.job_id, RelayOutcome.CREATED)
        assert await other.outbox_present([theirs.job_id]) == []
        assert await driver.outbox_present([mine.job_id]) == [mine.job_id]  # its own: untouched
        assert [r.id for r in await driver.list_jobs()] == [theirs.job_id]
        assert await other.list_jobs() == []


async def test_in_place_moves_rows_into_jobs_and_away_in_one_go(
    driver: Driver, manual_clock: ManualClock
) -> None:
    holder = await a_live_job_holding(driver, "order:1")
    # The oldest row is held by a two-step relay, under its lease.
    await driver.outbox_write([new_job()])
    [held] = (await take_rows(driver, 1, lease=30.0, relay_id="r1")).jobs
    rows = [new_job(payload={"n": n}) for n in range(3)] + [new_job(key="order:1")]
    await driver.outbox_write(rows)
    first = await driver.relay_in_place(driver, 2)
    assert [(d.job_id, d.outcome) for d in first] == [
        (rows[0].job_id, RelayOutcome.CREATED),
        (rows[1].job_id, RelayOutcome.CREATED),
    ]
    rest = await driver.relay_in_place(driver, 10)
    assert [(d.job_id, d.outcome, d.holder) for d in rest] == [
        (rows[2].job_id, RelayOutcome.CREATED, rows[2].job_id),
        (rows[3].job_id, RelayOutcome.KEY_HELD, holder.job_id),
    ]
    assert await driver.outbox_present([r.job_id for r in rows]) == []
    assert await driver.outbox_present([held.job_id]) == [held.job_id]
    assert await driver.relay_in_place(driver, 10) == []  # the leased row is left to its relay
    manual_clock.advance(30.0)  # that relay died: its row is taken in place now
    [late] = await driver.relay_in_place(driver, 10)
    assert late.job_id == held.job_id and late.outcome is RelayOutcome.CREATED
    assert sorted(r.id for r in await driver.list_jobs(limit=100)) == sorted(
        [holder.job_id, *(r.job_id for r in rows[:3]), held.job_id]
    )
    # Nothing in place is recorded: the row went with its job.
    assert await driver.relay_decisions(await driver.outbox_source(), before=1e12, limit=10) == []


async def test_in_place_answers_a_decision_a_two_step_relay_left_and_forgets_it(
    driver: Driver, manual_clock: ManualClock
) -> None:
    row = new_job()
    await driver.outbox_write([row])
    [taken] = (await take_rows(driver, 10, lease=5.0, relay_id="r1")).jobs
    source = await driver.outbox_source()
    await relay_write(driver, [taken], source=source)  # ... and that relay died here
    await finish_and_prune(driver, manual_clock)
    [moved] = await driver.relay_in_place(driver, 10)
    assert (moved.job_id, moved.outcome, moved.already) == (row.job_id, RelayOutcome.CREATED, True)
    assert await driver.list_jobs() == []  # not written again
    assert await driver.outbox_present([row.job_id]) == []
    assert await driver.relay_decisions(source, before=1e12, limit=10) == []


# The fence (issue 45): a relay paused past its lease wakes to find its rows taken over; its
# write must change nothing, however long it slept and whatever retention did meanwhile.


async def test_a_write_under_a_ticket_a_takeover_revoked_is_refused_and_changes_nothing(
    driver: Driver, manual_clock: ManualClock
) -> None:
    rows = [new_job(payload={"n": n}) for n in range(3)]
    await driver.outbox_write(rows)
    source = await driver.outbox_source()
    paused = await take_rows(driver, lease=5.0, relay_id="r1")
    manual_clock.advance(5.0)  # r1 is paused past its lease: r2 takes the rows over
    taker = await take_rows(driver, lease=5.0, relay_id="r2")
    assert [j.job_id for j in taker.jobs] == [r.job_id for r in rows]
    assert taker.superseded == (paused.ticket,)
    written = await driver.relay_enqueue(
        taker.jobs, source=source, ticket=taker.ticket, superseded=taker.superseded
    )
    assert [d.already for d in written] == [False] * 3
    ids = [r.job_id for r in rows]
    assert await driver.outbox_delete(ids, ticket=taker.ticket) == ids
    assert await driver.relay_forget(source, ids) == 3
    for _ in rows:
        await finish_and_prune(driver, manual_clock)
    # r1 wakes: no decision, no job, no row is left to answer it; only the fence can.
    with pytest.raises(RelayFenced, match="revoked"):
        await driver.relay_enqueue(paused.jobs, source=source, ticket=paused.ticket)
    assert await driver.list_jobs() == []
    assert await driver.relay_decisions(source, before=1e12, limit=10) == []


async def test_a_takeover_revokes_every_relay_that_held_a_row_before(
    driver: Driver, manual_clock: ManualClock
) -> None:
    row, source = await one_row_written(driver)
    first = await take_rows(driver, lease=5.0, relay_id="r1")
    manual_clock.advance(5.0)
    second = await take_rows(driver, lease=5.0, relay_id="r2")  # then paused too
    manual_clock.advance(5.0)
    third = await take_rows(driver, lease=5.0, relay_id="r3")
    assert (second.superseded, third.superseded) == ((first.ticket,), (first.ticket, second.ticket))
    await driver.relay_enqueue(
        third.jobs, source=source, ticket=third.ticket, superseded=third.superseded
    )
    for paused in (first, second):
        with pytest.raises(RelayFenced):
            await driver.relay_enqueue(paused.jobs, source=source, ticket=paused.ticket)
    assert [r.id for r in await driver.list_jobs()] == [row.job_id]


async def test_a_ticket_is_spent_by_its_write(driver: Driver) -> None:
    await driver.outbox_write([new_job()])
    source = await driver.outbox_source()
    batch = await take_rows(driver)
    await driver.relay_enqueue(batch.jobs, source=source, ticket=batch.ticket)
    with pytest.raises(RelayFenced):
        await driver.relay_enqueue(batch.jobs, source=source, ticket=batch.ticket)
    with pytest.raises(RelayFenced):
        await driver.relay_enqueue(batch.jobs, source=source, ticket="never-given")


async def test_a_relay_that_wrote_then_lost_its_rows_deletes_none_and_the_taker_is_answered(
    driver: Driver, manual_clock: ManualClock
) -> None:
    row, source = await one_row_written(driver)
    first = await take_rows(driver, lease=5.0, relay_id="r1")
    [decided] = await driver.relay_enqueue(first.jobs, source=source, ticket=first.ticket)
    manual_clock.advance(5.0)  # r1 paused after its write: r2 takes the row over
    second = await take_rows(driver, lease=5.0, relay_id="r2")
    # r1 wakes and deletes under its ticket: the row is r2's now, and so is its decision.
    assert await driver.outbox_delete([row.job_id], ticket=first.ticket) == []
    await finish_and_prune(driver, manual_clock)
    [again] = await driver.relay_enqueue(
        second.jobs, source=source, ticket=second.ticket, superseded=second.superseded
    )
    assert again == attrs.evolve(decided, already=True)
    assert await driver.outbox_delete([row.job_id], ticket=second.ticket) == [row.job_id]
    assert await driver.list_jobs() == []


async def test_a_stale_ticket_is_forgotten_and_its_write_refused(
    driver: Driver, manual_clock: ManualClock
) -> None:
    source = await driver.outbox_source()
    # Stale 60 s on (rules.STALE_TICKET_FLOOR: more than 4 leases of 5 s).
    used, idle = [await driver.relay_ticket(source, relay_id=r, lease=5.0) for r in ("r1", "r2")]
    manual_clock.advance(59.0)
    await driver.relay_ticket(source, relay_id="r3", lease=5.0)  # forgets none yet
    await driver.relay_enqueue([new_job()], source=source, ticket=used)
    manual_clock.advance(1.0)
    await driver.relay_ticket(source, relay_id="r3", lease=5.0)  # forgets r2's on its way
    with pytest.raises(RelayFenced):
        await driver.relay_enqueue([new_job()], source=source, ticket=idle)
    assert len(await driver.list_jobs()) == 1


async def test_in_place_revokes_the_ticket_of_a_two_step_relay_that_held_a_row(
    driver: Driver, manual_clock: ManualClock
) -> None:
    row, source = await one_row_written(driver)
    paused = await take_rows(driver, lease=5.0)
    manual_clock.advance(5.0)
    [moved] = await driver.relay_in_place(driver, 10)
    assert moved.job_id == row.job_id
    await finish_and_prune(driver, manual_clock)
    with pytest.raises(RelayFenced):
        await driver.relay_enqueue(paused.jobs, source=source, ticket=paused.ticket)
    assert await driver.list_jobs() == []


async def test_stats_show_the_rows_each_relay_holds_and_whether_its_lease_lapsed(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await driver.outbox_write([new_job() for _ in range(5)])
    await take_rows(driver, 2, lease=5.0, relay_id="r1")
    manual_clock.advance(1.0)
    await take_rows(driver, 1, lease=30.0, relay_id="r2")
    manual_clock.advance(4.0)
    now = manual_clock.now
    stats = await driver.outbox_stats()
    assert stats.pending == 5
    assert stats.held == (RelayHold("r1", 2, now), RelayHold("r2", 1, now + 26.0))
    assert [h.lapsed(now) for h in stats.held] == [True, False]
    assert stats.held[1].to_json(now) == {
        "relay_id": "r2",
        "rows": 1,
        "lease_left": 26.0,
        "lapsed": False,
    }
