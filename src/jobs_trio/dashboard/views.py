# What each dashboard page shows, read from a Driver: queue overviews with throughput, a filtered
# and paged job list, one job with its steps. Apart from the web app so the pages are plain values
# a test can check without HTTP, and so only existing driver reads are composed here.
# Internal: not part of the public API (docs/reference.md lists the public modules).
from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from ..driver import Driver
from ..errors import InvalidArgument
from ..operator_transitions import CANCELLABLE_STATES, RETRYABLE_STATES
from ..records import JobRecord, JobState, QueueStats, StepRecord

PAGE_SIZE = 50
# The job list pages by reading the newest N jobs through `Driver.list_jobs` (which has no
# offset and no name filter) and slicing here: the deepest page and a name filter see only this
# many of the newest jobs. The page says so rather than pretending the list is complete.
SCAN_LIMIT = 5_000
THROUGHPUT_MINUTES = 15
# Throughput counts completed jobs by the minute they were settled (`updated_at`), from the
# newest this many completed jobs of a queue: a queue finishing more than this in the window
# shows a chart marked as a lower bound.
THROUGHPUT_SAMPLE = 2_000


@attrs.frozen
class Throughput:
    per_minute: tuple[int, ...]  # oldest minute first; the last is the current minute
    lower_bound: bool  # the sample ran out inside the window: the true counts are higher

    @property
    def peak(self) -> int:
        return max(self.per_minute, default=0)


@attrs.frozen
class QueueView:
    stats: QueueStats
    throughput: Throughput


@attrs.frozen
class JobFilter:
    state: JobState | None = None
    queue: str | None = None
    name: str | None = None  # a prefix of the job's name
    page: int = 1

    @classmethod
    def parse(cls, query: dict[str, str]) -> JobFilter:
        """The filter a query string asks for; a bad value is an InvalidArgument naming it,
        never a silently empty list."""
        state_text = query.get("state") or None
        state = None
        if state_text is not None:
            try:
                state = JobState(state_text)
            except ValueError:
                raise InvalidArgument(
                    "state",
                    f"{state_text!r} is not a job state",
                    fix="use one of " + ", ".join(s.value for s in JobState),
                ) from None
        page_text = query.get("page") or "1"
        page = int(page_text) if page_text.isdecimal() and len(page_text) < 7 else 0
        if page < 1:
            raise InvalidArgument("page", f"{page_text!r} is not a page number", fix="use 1, 2, …")
        return cls(state, query.get("queue") or None, query.get("name") or None, page)


@attrs.frozen
class JobPage:
    jobs: tuple[JobRecord, ...]
    has_next: bool
    truncated: bool  # the read stopped at SCAN_LIMIT jobs: older ones were not looked at


async def queue_views(driver: Driver, now: float) -> list[QueueView]:
    views = []
    for stats in await driver.stats():
        completed = await driver.list_jobs(
            state=JobState.COMPLETED, queue=stats.queue, limit=THROUGHPUT_SAMPLE
        )
        views.append(QueueView(stats, throughput(completed, now, THROUGHPUT_SAMPLE)))
    return views


def throughput(
    completed: Sequence[JobRecord], now: float, sample: int, minutes: int = THROUGHPUT_MINUTES
) -> Throughput:
    """Completed jobs per minute over the last ``minutes``, newest minute last."""
    counts = [0] * minutes
    start = (math.floor(now / 60) - minutes + 1) * 60
    oldest_seen = math.inf
    for record in completed:
        oldest_seen = min(oldest_seen, record.updated_at)
        index = math.floor((record.updated_at - start) / 60)
        if 0 <= index < minutes:
            counts[index] += 1
    # A full sample whose oldest job is still inside the window was cut short by the limit.
    return Throughput(tuple(counts), len(completed) >= sample and oldest_seen >= start)


async def job_page(driver: Driver, wanted: JobFilter) -> JobPage:
    first = (wanted.page - 1) * PAGE_SIZE
    # One more than the page needs tells whether a next page exists.
    limit = min(SCAN_LIMIT, first + PAGE_SIZE + 1)
    if wanted.name is not None:
        limit = SCAN_LIMIT  # the name is matched here, so every scanned job may be a match
    records = await driver.list_jobs(state=wanted.state, queue=wanted.queue, limit=limit)
    truncated = limit == SCAN_LIMIT and len(records) >= SCAN_LIMIT
    if wanted.name is not None:
        records = [r for r in records if r.name.startswith(wanted.name)]
    shown = tuple(records[first : first + PAGE_SIZE])
    return JobPage(shown, len(records) > first + PAGE_SIZE, truncated)


@attrs.frozen
class JobDetail:
    job: JobRecord
    steps: tuple[StepRecord, ...]
    can_retry: bool
    can_cancel: bool


async def job_detail(driver: Driver, job_id: str) -> JobDetail | None:
    record = await driver.get(job_id)
    if record is None:
        return None
    steps = tuple(await driver.load_steps(job_id))
    return JobDetail(
        record,
        steps,
        can_retry=record.state in RETRYABLE_STATES,
        can_cancel=record.state in CANCELLABLE_STATES
        or (record.state is JobState.RUNNING and not record.cancel_requested),
    )
