# Retention's rules, as every driver's ``prune`` follows them: which finished jobs go when, and
# when a fleet's one prune turn may be taken. Apart because three drivers share them (the SQL
# drivers render them into their statements) and the pruner and the CLI only ask for turns.
"""Finished jobs are deleted after an age, so the jobs table stays the size of the live work.
Completed and cancelled jobs go after ``keep_finished`` seconds, dead ones (kept longer: an
operator re-runs them) after ``keep_dead``; the age is counted from the job's last change (for
a finished job, when it finished). Live jobs are never deleted. Deletion is in bounded batches
(one transaction each), and one pruner at a time in a fleet: a one-row turn record whose
compare-and-set each batch repeats, so a hundred workers do not each scan for the same rows."""

from __future__ import annotations

from .._core.records import JobState, PruneTurn

# Deleted after keep_finished seconds; dead jobs after keep_dead.
FINISHED_STATES = (JobState.COMPLETED, JobState.CANCELLED)
DEAD_STATE = JobState.DEAD


def turn_is_free(
    turn: PruneTurn,
    holder: str | None,
    held_until: float | None,
    ended_at: float | None,
    now: float,
) -> bool:
    """May ``turn.holder`` run a batch, given the stored turn record? Its own live turn goes on;
    a turn nobody holds (or whose holder has not come back within its hold) is taken once
    ``turn.every`` seconds have passed since the last turn ended."""
    if holder is not None and held_until is not None and held_until >= now:
        return holder == turn.holder
    return ended_at is None or ended_at <= now - turn.every


def cutoffs(turn: PruneTurn, now: float) -> tuple[float, float | None]:
    """The last-change times before which finished and dead jobs are deleted."""
    dead_before = None if turn.keep_dead is None else now - turn.keep_dead
    return now - turn.keep_finished, dead_before
