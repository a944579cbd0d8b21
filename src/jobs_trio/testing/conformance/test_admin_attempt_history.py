# Each job's attempt history (issue 36): a settlement written with a note adds one record in the
# same write, named by how the attempt ended (an operator's pending cancel makes it cancelled);
# a fenced write adds none; the newest ATTEMPT_HISTORY are kept; retention takes them with the
# job; the outcome counts the dashboard charts come from one read.
from __future__ import annotations

import attrs

from jobs_trio._core.records import (
    AttemptNote,
    AttemptRecord,
    CancelJob,
    Complete,
    DeadLetter,
    OutcomeCount,
    Park,
    PruneTurn,
    Retry,
    Settlement,
    Suspend,
)
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import ATTEMPT_HISTORY
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, enqueue_one, new_job


def noted(settlement: Settlement, attempt: int, seconds: float | None = 1.5) -> Settlement:
    note = AttemptNote(attempt, "w-1", seconds, "Traceback ...\nValueError: no")
    return attrs.evolve(settlement, note=note)


async def test_each_ending_with_a_note_is_recorded_by_its_outcome(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver, attempts=5)
    endings: list[tuple[type, str, str | None]] = []
    ended_at: list[float] = []

    async def end(make: object, outcome: str, error: str | None) -> None:
        claim = await claim_one(driver)
        manual_clock.advance(2)
        settlement = make(claim.lease)  # type: ignore[operator]
        assert await driver.settle([noted(settlement, claim.attempt)]) == [job_id]
        endings.append((type(settlement), outcome, error))
        ended_at.append(manual_clock.now)

    await end(lambda lease: Retry(lease, 0.0, "E1: flaky"), "retried", "E1: flaky")
    await end(
        lambda lease: Retry(lease, 0.0, "X_DRAINING", hands_back=True),
        "interrupted",
        "X_DRAINING",
    )
    await end(lambda lease: Suspend(lease, 0.0), "suspended", None)
    await end(lambda lease: Park(lease, "not in this deploy"), "parked", "not in this deploy")
    await driver.retry(job_id)  # parked: an operator puts it back
    await end(lambda lease: Complete(lease, '{"ok": true}'), "completed", None)
    history = await driver.load_attempts(job_id)
    assert [(r.seq, r.outcome, r.error) for r in history] == [
        (n, outcome, error) for n, (_, outcome, error) in enumerate(endings, 1)
    ]
    # The attempt numbers as claimed: a retried attempt counted, the interrupted, suspended
    # and parked ones handed back; the operator's retry reset the count.
    assert [r.attempt for r in history] == [1, 2, 2, 2, 1]
    first = history[0]
    assert first == AttemptRecord(
        seq=1,
        attempt=1,
        outcome="retried",
        worker_id="w-1",
        ended_at=first.ended_at,
        seconds=1.5,
        error="E1: flaky",
        traceback="Traceback ...\nValueError: no",
    )
    assert [r.ended_at for r in history] == ended_at
    # A completion's record whole.
    assert history[-1] == AttemptRecord(
        seq=5,
        attempt=1,
        outcome="completed",
        worker_id="w-1",
        ended_at=ended_at[-1],
        seconds=1.5,
        error=None,
        traceback="Traceback ...\nValueError: no",
    )


async def test_a_batch_of_completions_records_each_whole(
    driver: Driver, manual_clock: ManualClock
) -> None:
    """Completions settled together: a driver may write them by a path of its own (SQLite's
    batch builds each row without an AttemptRecord), and each record is still the one a single
    completion leaves."""
    first = await enqueue_one(driver, queue="a")
    second = await enqueue_one(driver, queue="b")
    claim_a = await claim_one(driver, "a")
    claim_b = await claim_one(driver, "b")
    manual_clock.advance(7)
    await driver.settle(
        [
            noted(Complete(claim_a.lease, '{"n": 1}'), claim_a.attempt, seconds=0.25),
            noted(Complete(claim_b.lease), claim_b.attempt, seconds=None),
        ]
    )
    [a] = await driver.load_attempts(first)
    [b] = await driver.load_attempts(second)
    traceback = "Traceback ...\nValueError: no"
    assert a == AttemptRecord(1, 1, "completed", "w-1", manual_clock.now, 0.25, None, traceback)
    assert b == AttemptRecord(1, 1, "completed", "w-1", manual_clock.now, None, None, traceback)


async def test_a_dead_letter_and_a_cancel_are_recorded(driver: Driver) -> None:
    dead = await enqueue_one(driver, queue="a")
    cancelled = await enqueue_one(driver, queue="b")
    claim_a = await claim_one(driver, "a")
    claim_b = await claim_one(driver, "b")
    await driver.settle(
        [
            noted(DeadLetter(claim_a.lease, "boom"), claim_a.attempt),
            noted(CancelJob(claim_b.lease, "stopped by an operator"), claim_b.attempt),
        ]
    )
    [a] = await driver.load_attempts(dead)
    [b] = await driver.load_attempts(cancelled)
    assert (a.outcome, a.error) == ("dead-lettered", "boom")
    assert (b.outcome, b.error) == ("cancelled", "stopped by an operator")


async def test_an_operators_pending_cancel_records_the_ending_as_cancelled(
    driver: Driver,
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.cancel(job_id)  # running: only flagged
    await driver.settle([noted(Retry(claim.lease, 5.0, "E: failed"), claim.attempt)])
    job = await driver.get(job_id)
    assert job is not None and job.state.value == "cancelled"
    [record] = await driver.load_attempts(job_id)
    assert record.outcome == "cancelled" and record.error == job.last_error


async def test_a_fenced_settlement_and_one_without_a_note_add_nothing(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.settle([Retry(claim.lease, 0.0, "no note")])  # written, not recorded
    stale = claim.lease
    await driver.settle([noted(Complete(stale), claim.attempt)])  # fenced: changes nothing
    assert await driver.load_attempts(job_id) == []
    again = await claim_one(driver)
    await driver.settle([noted(Complete(again.lease), again.attempt)])
    [record] = await driver.load_attempts(job_id)
    # Counted among the job's endings, the note-less one too: seq says which ending it was.
    assert (record.outcome, record.attempt, record.seq) == ("completed", 2, 2)


async def test_the_history_keeps_the_newest_endings(driver: Driver) -> None:
    job_id = await enqueue_one(driver, attempts=1)
    endings = ATTEMPT_HISTORY + 7
    for n in range(endings):
        claim = await claim_one(driver)
        # Handed back each time (a drain at every deploy): the history must not grow.
        handed_back = Retry(claim.lease, 0.0, f"drained {n}", hands_back=True)
        await driver.settle([noted(handed_back, claim.attempt)])
    history = await driver.load_attempts(job_id)
    assert len(history) == ATTEMPT_HISTORY
    assert [r.seq for r in history] == list(range(8, endings + 1))
    assert history[-1].error == f"drained {endings - 1}"


async def test_retention_deletes_the_history_with_its_job(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.settle([noted(Complete(claim.lease), claim.attempt)])
    manual_clock.advance(100)
    pruned = await driver.prune(PruneTurn("w1", keep_finished=10, keep_dead=None))
    assert pruned.deleted == 1
    assert await driver.load_attempts(job_id) == []
    assert await driver.outcome_counts(0, 60) == []


async def test_outcome_counts_buckets_the_recorded_endings(
    driver: Driver, manual_clock: ManualClock
) -> None:
    manual_clock.advance(1_000_000 - manual_clock.now)  # a bucket boundary: 1,000,000 = 60k
    start = manual_clock.now - 1_000_000 % 60
    for delay, settle in ((10, "ok"), (20, "ok"), (70, "fail"), (75, "ok"), (200, "dead")):
        manual_clock.advance(start + delay - manual_clock.now)
        await enqueue_one(driver)
        claim = await claim_one(driver)
        endings: dict[str, Settlement] = {
            "ok": Complete(claim.lease),
            "fail": Retry(claim.lease, 3600.0, "E"),
            "dead": DeadLetter(claim.lease, "E"),
        }
        ending = endings[settle]
        await driver.settle([noted(ending, claim.attempt)])
    assert await driver.outcome_counts(start, 60) == [
        OutcomeCount(start, "completed", 2),
        OutcomeCount(start + 60, "completed", 1),
        OutcomeCount(start + 60, "retried", 1),
        OutcomeCount(start + 180, "dead-lettered", 1),
    ]
    # `since` leaves out what ended before it.
    assert await driver.outcome_counts(start + 150, 60) == [
        OutcomeCount(start + 180, "dead-lettered", 1)
    ]


async def test_name_stats_sum_each_names_attempts_by_outcome_and_run_time(
    driver: Driver, manual_clock: ManualClock
) -> None:
    queues = iter(range(100))

    async def ended(name: str, make: object, seconds: float | None) -> None:
        queue = f"q{next(queues)}"  # a queue each: the claim takes this job, no other
        await driver.enqueue([new_job(name, queue=queue)])
        claim = await claim_one(driver, queue=queue)
        settlement = make(claim.lease)  # type: ignore[operator]
        assert await driver.settle([noted(settlement, claim.attempt, seconds)])

    await ended("old.job", lambda lease: Complete(lease), 9.0)
    manual_clock.advance(100)
    since = manual_clock.now
    await ended("mail.send", lambda lease: Complete(lease), 0.5)
    await ended("mail.send", lambda lease: Complete(lease), 1.5)
    await ended("mail.send", lambda lease: Retry(lease, 60, "E: flaky"), 4.0)
    await ended("mail.send", lambda lease: Retry(lease, 0, "X_DRAINING", hands_back=True), None)
    await ended("report.build", lambda lease: DeadLetter(lease, "E: bad"), 2.0)
    [mail, report] = await driver.name_stats(since)
    assert (mail.name, dict(mail.outcomes)) == (
        "mail.send",
        {"completed": 2, "retried": 1, "interrupted": 1},
    )
    assert (mail.timed, mail.seconds, mail.longest) == (3, 6.0, 4.0)
    assert (mail.mean_seconds, mail.failure_rate) == (2.0, 1 / 3)
    assert (report.name, dict(report.outcomes), report.failure_rate) == (
        "report.build",
        {"dead-lettered": 1},
        1.0,
    )
    # Older attempts are left out; a deleted job's attempts go with it.
    assert [s.name for s in await driver.name_stats(since - 200)] == [
        "mail.send",
        "old.job",
        "report.build",
    ]
    [dead] = await driver.list_jobs(name="report.build")
    await driver.delete(dead.id)
    assert [s.name for s in await driver.name_stats(since)] == ["mail.send"]


# Text a note carries as its writer gave it, in one batch beside plain text: what an array
# literal must quote or escape (issue 44: PostgreSQL sends these columns as one), and what it
# must not take for a NULL.
HOSTILE_TEXT = [
    "w-plain",
    "NULL",
    "null",
    "",
    " leading and trailing ",
    'quote " and backslash \\ and \\" both',
    "{braces},commas,}",
    "line\nbreak\ttab\r",
    "émoji 🎉 and ‮ an override",
    "\\",
    '"',
    "x" * 5000,
]


async def test_each_notes_text_comes_back_as_written_from_one_batch(driver: Driver) -> None:
    jobs = [await enqueue_one(driver) for _ in HOSTILE_TEXT]
    claims = [await claim_one(driver) for _ in jobs]
    settled = [
        Retry(
            claim.lease,
            60.0,
            f"E: {text}",
            note=AttemptNote(claim.attempt, text, 0.5, None if i % 3 == 0 else text),
        )
        for i, (claim, text) in enumerate(zip(claims, HOSTILE_TEXT, strict=True))
    ]
    assert sorted(await driver.settle(settled)) == sorted(c.job_id for c in claims)
    for i, (claim, text) in enumerate(zip(claims, HOSTILE_TEXT, strict=True)):
        [record] = await driver.load_attempts(claim.job_id)
        assert (record.worker_id, record.traceback, record.error) == (
            text,
            None if i % 3 == 0 else text,
            f"E: {text}",
        )
