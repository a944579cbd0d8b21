# What a batch takes from the settler's queue, for every mix of queue: from the front, up to the
# batch's size, never one job twice, and for a claim only what it may carry.
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from jobs_trio._core.records import Complete, Lease
from jobs_trio._run.settler import Settler, _Pending
from jobs_trio.drivers.memory import MemoryDriver

# A queue: (job, carriable) per settlement, few jobs so that one job's two runs meet often.
queues = st.lists(st.tuples(st.sampled_from("abcd"), st.booleans()), max_size=12)


def pending(job: str, carriable: bool, n: int) -> _Pending:
    one = _Pending(Complete(Lease(job, f"token{n}"), "null"))
    if not carriable:
        one.carriable = False
    return one


def taken_one_at_a_time(
    queue: list[_Pending], most: int, by_writer: bool
) -> tuple[list[_Pending], list[_Pending]]:
    """The rule, spelled out: from the front, up to ``most``, stopping at a job already taken
    and (for a claim) at the first that is not carriable. Answers the batch and what is left."""
    batch: list[_Pending] = []
    jobs: set[str] = set()
    for one in queue:
        job = one.settlement.lease.job_id
        if len(batch) == most or job in jobs or not (by_writer or one.carriable):
            break
        batch.append(one)
        jobs.add(job)
    return batch, queue[len(batch) :]


@given(queue=queues, most=st.integers(1, 8), by_writer=st.booleans())
def test_a_batch_takes_what_the_one_at_a_time_rule_takes(
    queue: list[tuple[str, bool]], most: int, by_writer: bool
) -> None:
    settler = Settler(MemoryDriver(), max_batch=most)
    made = [pending(job, carriable, n) for n, (job, carriable) in enumerate(queue)]
    settler._queue.extend(made)
    batch = settler._take(by_writer=by_writer)
    expected, left = taken_one_at_a_time(made, most, by_writer)
    assert batch == expected
    assert list(settler._queue) == left


def test_a_queue_that_fits_with_one_job_twice_is_taken_up_to_the_second_run() -> None:
    """Everything fits in the batch, but a job's second run waits for the next (a driver
    answers by job id: in one batch the fenced run would pass for written)."""
    settler = Settler(MemoryDriver(), max_batch=10)
    made = [pending(job, True, n) for n, job in enumerate("abca")]
    settler._queue.extend(made)
    assert settler._take(by_writer=True) == made[:3]
    assert list(settler._queue) == made[3:]
