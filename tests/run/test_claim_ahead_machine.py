# The shutdown machine with claims taken ahead (claim_ahead, hold limit), operators' cancels
# and a manual bind without a drain: no held claim is left queued or counted once stopped.
from __future__ import annotations

import contextlib

from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

import jobs_trio._run.worker as worker_module
from jobs_trio._core.records import JobState, Retry
from jobs_trio._run.run_scope import CancelReason
from tests.helpers.worker_helpers import fresh_metrics
from tests.run.test_shutdown_machine import ApartDriver, ShutdownMachine, machine_settings


class AheadMachine(ShutdownMachine):
    def __init__(self) -> None:
        super().__init__()
        self.worker = worker_module.Worker(
            self.driver,
            self.worker.registry,
            concurrency=2,
            claim_ahead=3,
            hold_limit=7.0,
            lease=30.0,
            poll_interval=1.0,
            metrics=fresh_metrics(),
            stats_interval=None,
        )

    @rule(delay=st.sampled_from([0.0, 3.0, 40.0]))
    def manual_bind(self, delay: float) -> None:
        if not self._worker_in("idle", "running", "draining"):
            return
        at = self.trio.clock.current_time() + delay
        self._bound(at)

        async def bind() -> None:
            self.worker.bind(at)

        self.trio.call(bind)

    @rule(i=st.integers(0, 30))
    def operator_cancel(self, i: int) -> None:
        if not self.enqueued:
            return
        job_id = self.enqueued[i % len(self.enqueued)]
        with contextlib.suppress(Exception):  # already ended: nothing to cancel
            self.trio.call(self.driver.cancel, job_id)

    @invariant()
    def counts_are_zero_once_stopped(self) -> None:
        # (in_flight is not: a run the budget gave up on may unwind after STOPPED.)
        if self.worker.state != "stopped":
            return
        stats = self.worker.stats()
        assert stats.claimed_ahead == 0, stats
        assert not self.worker._slots.waiting()

    @invariant()
    def interrupted_attempts_are_handed_back(self) -> None:  # 5, with hold limits
        for outcome, run, generation, drained_at, _ in self.verdicts:
            if outcome.kind == "interrupted":
                handed_back = (
                    CancelReason.HELD_TOO_LONG,
                    CancelReason.CLAIM_LATE,
                    CancelReason.LEASE_EXPIRED,
                )
                assert drained_at is not None or run.reason in handed_back, (
                    f"{outcome.name} {outcome.job_id} interrupted ({run.reason}) in {generation}"
                )
                assert isinstance(outcome.settlement, Retry)
                assert outcome.settlement.hands_back
                assert outcome.settlement.delay == 0

    @invariant()
    def every_interrupted_attempt_left_its_attempt_count_unchanged(self) -> None:
        for job_id, before, after in self.driver.handed_back:
            if self.driver._jobs[job_id].state is JobState.CANCELLED:
                continue  # an operator's cancel wins over the hand-back
            assert after == before, f"job {job_id}: {before} attempts before, {after} after"

    @invariant()
    def nothing_enqueued_is_lost(self) -> None:  # 1
        for job_id in self.enqueued:
            record = self.driver._jobs.get(job_id)
            assert record is not None, f"job {job_id} vanished"
            if record.state is JobState.RUNNING:
                assert record.lease_until is not None, f"{job_id} running with no lease"
            else:
                assert record.state in (
                    JobState.READY,
                    JobState.COMPLETED,
                    JobState.DEAD,
                    JobState.CANCELLED,
                ), record


AheadMachine.TestCase.settings = machine_settings(300)


class TestAheadMachine(AheadMachine.TestCase):  # type: ignore[misc]
    pass


class AheadApart(AheadMachine):
    driver_class = ApartDriver


AheadApart.TestCase.settings = machine_settings(150)


class TestAheadApart(AheadApart.TestCase):  # type: ignore[misc]
    pass
