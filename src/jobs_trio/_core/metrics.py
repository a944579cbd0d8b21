# Prometheus metrics: attempts by outcome, run and wait durations, queue depth, a worker's slots,
# the outbox's backlog. Apart so the worker only says what happened; the names, the labels and
# their bounds are decided here (docs/metrics.md lists them).
from __future__ import annotations

import bisect
import itertools
import math
import operator
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .errors import ConfigError
from .records import JobState, OutboxStats, OutcomeKind, QueueStats

# Every name starts with this (Prometheus' convention: the exporter's name first).
PREFIX = "jobs_trio_"

# Only these reach jobs_total: interrupted, suspended, lost, parked and cancelled attempts are
# not failures of the job, and counting them would spike `failed` on every deploy. Every
# outcome, those included, is counted in attempts_total.
COUNTED_OUTCOMES = {
    OutcomeKind.COMPLETED: "ok",
    OutcomeKind.RETRIED: "failed",
    OutcomeKind.DEAD_LETTERED: "dead",
}

# The job label of an attempt whose name this deploy does not know (it was parked). Labelled by
# its name, every distinct unknown name read from the database would add children to every
# series for the life of the process: 3,000 names made /metrics 3.8 MB.
UNKNOWN_JOB = "unknown"

# The queue labels a process's metrics keep, at most, and the (queue, job) pairs its per-job
# series keep: the first seen keep theirs for the life of the process (a counter must never
# move from one series to another: its rate would read a reset), the queues the process's
# workers claim from first; the rest are counted under OTHER_QUEUES / OTHER_JOBS. Unbounded,
# a worker claiming 5,000 queues exported 16.2 MB and 256,668 series, and a scrape took 10.4 s
# (past Prometheus's default timeout); 10,000 queues observed made 1.4 MB.
MAX_QUEUE_LABELS = 50
MAX_JOB_LABELS = 50
OTHER_QUEUES = "(other)"
OTHER_JOBS = "(other)"

# Seconds a body ran: from a millisecond to four hours (prometheus-client's default buckets end
# at 10 s, and every p95 of a longer job read as 10 s). ``Metrics(run_buckets=...)`` sets others.
RUN_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400)
# Seconds from due to start: a job waiting behind others (or for a free slot) for minutes.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

# Every state a queue's depth is exported in, 0 included.
_STATES = tuple(state.value for state in JobState)

SlotReader = Callable[[], Mapping[str, tuple[int, int]]]  # queue -> (running, slots)


class Metrics:
    """The process's metrics on ``registry``. prometheus-client's ``_created`` series (a gauge
    of each counter's creation time, which read as "jobs created") are turned off for the
    process: ``prometheus_client.disable_created_metrics()``, which applies to the
    application's own metrics too (docs/metrics.md).

    The attempts' counts and times are counted by each worker in a ``Tally`` of its own, with no
    lock, and folded into the exposition at each scrape (``_Collected``), where the bound on
    the labels is applied."""

    def __init__(
        self,
        registry: CollectorRegistry = REGISTRY,
        *,
        max_queue_labels: int = MAX_QUEUE_LABELS,
        max_job_labels: int = MAX_JOB_LABELS,
        run_buckets: Sequence[float] = RUN_BUCKETS,
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        self.run_buckets = checked_buckets(run_buckets)
        self._collected = _Collected(max_queue_labels, max_job_labels, self.run_buckets)
        registry.register(self._collected)
        # What an attempt_finished / run_started called outside a worker counts (under a lock:
        # any thread may call them).
        self._shared = Tally(self.run_buckets)
        self._shared_lock = threading.Lock()
        self._collected.adopt(self._shared)
        self.tasks_fired = Counter(
            f"{PREFIX}task_fires_total", "Cron task fires enqueued", ["task"], registry=registry
        )
        self.tasks_skipped = Counter(
            f"{PREFIX}task_missed_skipped_total",
            "Scheduled times of a cron task its missed-run policy skipped",
            ["task"],
            registry=registry,
        )
        self.jobs_pruned = Counter(
            f"{PREFIX}pruned_total", "Finished jobs deleted by retention", registry=registry
        )
        # The outbox's gauges exist once a relay observes an outbox: a worker running no relay
        # exported two zeros that read as "the outbox is keeping up".
        self._outbox: tuple[Gauge, Gauge] | None = None

    # What a worker reports.

    def tally(self) -> Tally:
        """A tally for one worker's run, counted by its Trio thread alone and read at each
        scrape; ``retire`` it when the run ends."""
        tally = Tally(self.run_buckets)
        self._collected.adopt(tally)
        return tally

    def retire(self, tally: Tally) -> None:
        """``tally``'s run ended: its counts stay in the totals, folded with the others'."""
        self._collected.retire(tally)

    def watch_slots(self, worker: str, reader: SlotReader) -> None:
        """Export a worker's slots (``jobs_trio_running``, ``jobs_trio_free_slots``) from
        ``reader`` at each scrape while it runs; its queues are the first to get labels."""
        self._collected.labels.own(sorted(reader()))
        self._collected.slots[worker] = reader

    def unwatch_slots(self, worker: str) -> None:
        self._collected.slots.pop(worker, None)

    def jobs_declared(self, jobs: Iterable[tuple[str, str]]) -> None:
        """Export ``jobs_total`` at 0 for each (queue, job) a worker runs: a rate over a series
        that appears only with its first failure reads as no failures at all."""
        self._collected.declare(jobs)

    def run_started(self, queue: str, waited: float) -> None:
        with self._shared_lock:
            self._shared.run_started(queue, waited)

    def attempt_finished(self, queue: str, job: str, outcome: OutcomeKind, seconds: float) -> None:
        with self._shared_lock:
            self._shared.attempt_finished(queue, job, outcome, seconds)

    def task_fired(self, task: str) -> None:
        self.tasks_fired.labels(task=task).inc()

    def task_skipped(self, task: str, count: int) -> None:
        self.tasks_skipped.labels(task=task).inc(count)

    def queues_observed(self, stats: Sequence[QueueStats]) -> None:
        self._collected.queues = tuple(stats)

    # What a relay reports.

    @property
    def outbox_pending(self) -> Gauge:
        return self._outbox_gauges()[0]

    @property
    def outbox_oldest_seconds(self) -> Gauge:
        return self._outbox_gauges()[1]

    def outbox_observed(self, stats: OutboxStats) -> None:
        self.outbox_pending.set(stats.pending)
        self.outbox_oldest_seconds.set(stats.oldest_age or 0.0)

    def _outbox_gauges(self) -> tuple[Gauge, Gauge]:
        if self._outbox is None:
            self._outbox = (
                Gauge(
                    f"{PREFIX}outbox_pending",
                    "Outbox rows written and not yet relayed",
                    registry=self.registry,
                ),
                Gauge(
                    f"{PREFIX}outbox_oldest_seconds",
                    "Age of the oldest outbox row: how far the relay lags",
                    registry=self.registry,
                ),
            )
        return self._outbox


def checked_buckets(buckets: Sequence[float]) -> tuple[float, ...]:
    """Histogram bounds as given, checked: finite, positive, increasing (``+Inf`` is added)."""
    bounds = tuple(float(b) for b in buckets)
    if not bounds or any(not math.isfinite(b) or b <= 0 for b in bounds):
        raise ConfigError(
            f"histogram buckets {list(buckets)!r} must be positive, finite numbers of seconds",
            fix="give bucket bounds in seconds, such as 0.01,1,60,3600 (+Inf is added)",
        )
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ConfigError(
            f"histogram buckets {list(buckets)!r} are not in increasing order",
            fix="list the bounds from the smallest to the largest, each once",
        )
    return bounds


class _Histogram:
    """One histogram series' counts: per bucket (not cumulative: one increment an
    observation), and the sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0


class _JobCounts:
    """One (queue, job)'s attempts by outcome and its bodies' run times."""

    __slots__ = ("outcomes", "run")

    def __init__(self, buckets: int) -> None:
        self.outcomes: dict[OutcomeKind, int] = {}
        self.run = _Histogram(buckets)


# A copy of a tally's counts: (queue, job, outcomes, run buckets, run sum) and (queue, wait
# buckets, wait sum).
_JobsCopy = tuple[str, str, dict[OutcomeKind, int], list[int], float]
_WaitsCopy = tuple[str, list[int], float]


class Tally:
    """Attempt counts of one worker: plain numbers its Trio thread adds to, no lock and no
    label lookup per job (the prometheus-client children took a lock each, 5 a job, issue 44).
    A scrape from another thread copies them as they are: a histogram's count is the sum of
    its buckets, so what it reads is consistent, at most an attempt behind."""

    __slots__ = ("_bounds", "jobs", "waits")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.jobs: dict[tuple[str, str], _JobCounts] = {}
        self.waits: dict[str, _Histogram] = {}

    def attempt_finished(self, queue: str, job: str, outcome: OutcomeKind, seconds: float) -> None:
        if outcome is OutcomeKind.PARKED:  # a name this deploy does not declare
            job = UNKNOWN_JOB
        counts = self.jobs.get((queue, job))
        if counts is None:
            counts = self.jobs[(queue, job)] = _JobCounts(len(self._bounds))
        outcomes = counts.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        run = counts.run
        # le is "less than or equal": the first bound at or above the time.
        run.counts[bisect.bisect_left(self._bounds, seconds)] += 1
        run.sum += seconds

    def run_started(self, queue: str, waited: float) -> None:
        waits = self.waits.get(queue)
        if waits is None:
            waits = self.waits[queue] = _Histogram(len(WAIT_BUCKETS))
        if waited < 0.0:  # clocks apart (not max(): an object a job, issue 44)
            waited = 0.0
        waits.counts[bisect.bisect_left(WAIT_BUCKETS, waited)] += 1
        waits.sum += waited

    def snapshot(self) -> tuple[list[_JobsCopy], list[_WaitsCopy]]:
        """A copy of every count as it is now (from any thread: each copy is one C call
        under the GIL, which the counting thread cannot interleave)."""
        jobs = [
            (queue, job, dict(c.outcomes), list(c.run.counts), c.run.sum)
            for (queue, job), c in list(self.jobs.items())
        ]
        waits = [(queue, list(h.counts), h.sum) for queue, h in list(self.waits.items())]
        return jobs, waits


class _Labels:
    """Which queues, and which (queue, job) pairs, have labels of their own: the first seen,
    up to each bound, for the life of the process; the rest are counted under OTHER_QUEUES and
    OTHER_JOBS. Decided once per queue and pair, so no count moves between series."""

    def __init__(self, max_queues: int, max_jobs: int) -> None:
        self._max_queues = max_queues
        self._max_jobs = max_jobs
        self._queues: set[str] = set()
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self._lock = threading.Lock()

    def own(self, queues: Iterable[str]) -> None:
        """Queues this process's workers claim from: labelled first, while there is room."""
        with self._lock:
            for queue in queues:
                self._queue(queue)

    def queue(self, queue: str) -> str:
        if queue in self._queues:
            return queue
        if len(self._queues) >= self._max_queues:
            return OTHER_QUEUES  # the set only grows: full, it stays full
        with self._lock:
            return self._queue(queue)

    def _queue(self, queue: str) -> str:
        if queue in self._queues:
            return queue
        if len(self._queues) < self._max_queues:
            self._queues.add(queue)
            return queue
        return OTHER_QUEUES

    def pair(self, queue: str, job: str) -> tuple[str, str]:
        labels = self._pairs.get((queue, job))
        if labels is not None:
            return labels
        if len(self._pairs) >= self._max_jobs:
            return self.queue(queue), OTHER_JOBS
        with self._lock:
            labels = self._pairs.get((queue, job))
            if labels is None:
                shown = self._queue(queue)
                if len(self._pairs) < self._max_jobs:
                    labels = self._pairs[(queue, job)] = (shown, job)
                else:
                    # Not remembered: the bound is reached, and stays reached.
                    labels = (shown, OTHER_JOBS)
            return labels


class _Collected(Collector):
    """Everything read at scrape time: the workers' tallies (attempts, run and wait times);
    each queue's depth by state (every state, 0 included), its oldest due job's age, its dead
    jobs, the jobs a fleet limit put off, from the last observation; and the slots of the
    workers running in this process. Every label goes through ``_Labels``: the series are
    bounded whatever the number of queues and jobs."""

    def __init__(self, max_queue_labels: int, max_job_labels: int, run_buckets: tuple[float, ...]):
        self.labels = _Labels(max_queue_labels, max_job_labels)
        self.run_buckets = run_buckets
        self.queues: tuple[QueueStats, ...] = ()
        self.slots: dict[str, SlotReader] = {}
        self._live: list[Tally] = []
        # What retired tallies counted, summed: per (queue, job) labels, and per queue label.
        self._retired = Tally(run_buckets)
        self._declared: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def adopt(self, tally: Tally) -> None:
        with self._lock:
            self._live.append(tally)

    def retire(self, tally: Tally) -> None:
        with self._lock:
            if tally not in self._live:
                return
            self._live.remove(tally)
            jobs, waits = tally.snapshot()
            into = self._retired
            for queue, job, outcomes, counts, total in jobs:
                mine = into.jobs.get((queue, job))
                if mine is None:
                    mine = into.jobs[(queue, job)] = _JobCounts(len(self.run_buckets))
                for outcome, n in outcomes.items():
                    mine.outcomes[outcome] = mine.outcomes.get(outcome, 0) + n
                _add(mine.run, counts, total)
            for queue, counts, total in waits:
                histogram = into.waits.get(queue)
                if histogram is None:
                    histogram = into.waits[queue] = _Histogram(len(WAIT_BUCKETS))
                _add(histogram, counts, total)

    def declare(self, jobs: Iterable[tuple[str, str]]) -> None:
        pairs = list(jobs)
        for queue, job in pairs:
            self.labels.pair(queue, job)
        with self._lock:
            self._declared.update(pairs)

    def describe(self) -> Iterable[Metric]:
        return []  # collected at each scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._attempts()
        yield from self._observed()

    def _attempts(self) -> Iterator[Metric]:
        with self._lock:
            tallies = [*self._live, self._retired]
            declared = list(self._declared)
        outcomes: dict[tuple[str, str, OutcomeKind], int] = {}
        runs: dict[tuple[str, str], _Histogram] = {}
        waits: dict[str, _Histogram] = {}
        pair, queue_label = self.labels.pair, self.labels.queue
        for tally in tallies:
            jobs, waited = tally.snapshot()
            for queue, job, counted, counts, total in jobs:
                labels = pair(queue, job)
                for outcome, n in counted.items():
                    key = (*labels, outcome)
                    outcomes[key] = outcomes.get(key, 0) + n
                run = runs.get(labels)
                if run is None:
                    run = runs[labels] = _Histogram(len(self.run_buckets))
                _add(run, counts, total)
            for queue, counts, total in waited:
                label = queue_label(queue)
                histogram = waits.get(label)
                if histogram is None:
                    histogram = waits[label] = _Histogram(len(WAIT_BUCKETS))
                _add(histogram, counts, total)
        jobs_total = CounterMetricFamily(
            f"{PREFIX}jobs",
            "Attempts finished that count for or against a job: ok, failed (retried), dead",
            labels=["queue", "job", "outcome"],
        )
        counted_jobs: dict[tuple[str, str, str], int] = {}
        for queue, job in declared:
            shown = pair(queue, job)
            for label in COUNTED_OUTCOMES.values():
                counted_jobs.setdefault((*shown, label), 0)
        attempts_total = CounterMetricFamily(
            f"{PREFIX}attempts",
            "Attempts ended, by every outcome: completed, retried, dead-lettered, interrupted"
            " (drained), suspended, lost, cancelled, parked",
            labels=["queue", "job", "outcome"],
        )
        for (queue, job, outcome), n in sorted(outcomes.items()):
            attempts_total.add_metric([queue, job, outcome.value], n)
            as_counted = COUNTED_OUTCOMES.get(outcome)
            if as_counted is not None:
                counted_key = (queue, job, as_counted)
                counted_jobs[counted_key] = counted_jobs.get(counted_key, 0) + n
        for job_labels, n in sorted(counted_jobs.items()):
            jobs_total.add_metric(list(job_labels), n)
        run_seconds = HistogramMetricFamily(
            f"{PREFIX}run_seconds", "Time a job body ran", labels=["queue", "job"]
        )
        for labels, histogram in sorted(runs.items()):
            run_seconds.add_metric(list(labels), *_exposed(histogram, self.run_buckets))
        wait_seconds = HistogramMetricFamily(
            f"{PREFIX}wait_seconds",
            "Time from a job being due (enqueued, or its delay or backoff over) to its start",
            labels=["queue"],
        )
        for label, histogram in sorted(waits.items()):
            wait_seconds.add_metric([label], *_exposed(histogram, WAIT_BUCKETS))
        yield from (jobs_total, attempts_total, run_seconds, wait_seconds)

    def _observed(self) -> Iterator[Metric]:
        slots = self._slots()
        label = self.labels.queue
        depth = GaugeMetricFamily(
            f"{PREFIX}queue_depth", "Jobs in a queue, by state", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            f"{PREFIX}queue_oldest_ready_seconds", "Age of the oldest due job", labels=["queue"]
        )
        dead = GaugeMetricFamily(
            f"{PREFIX}queue_dead_jobs", "Dead-lettered jobs kept", labels=["queue"]
        )
        waiting = GaugeMetricFamily(
            f"{PREFIX}limit_waiting",
            "Ready jobs a claim put off for a fleet limit: limit is 'slot' (runs at once) or"
            " 'rate' (starts per period)",
            labels=["queue", "job", "limit"],
        )
        # An operator paused it (issue 46): 1 for each labelled queue paused, no series for
        # the others (a series each would be another gauge per queue on every scrape).
        paused = GaugeMetricFamily(
            f"{PREFIX}queue_paused", "1 while an operator has paused the queue", labels=["queue"]
        )
        paused_queues: set[str] = set()
        counts: dict[str, dict[str, int]] = {}
        ages: dict[str, float] = {}
        dead_jobs: dict[str, int] = {}
        put_off: dict[tuple[str, str, str], int] = {}
        observed = self.queues
        # A queue this process claims from has every state, at 0, before it holds any job.
        # Labelled in name order: the first look at 10,000 queues labels the first by name.
        for name in sorted({*(q.queue for q in observed), *slots}):
            queue = label(name)
            if queue not in counts:
                counts[queue], ages[queue], dead_jobs[queue] = {}, 0.0, 0
        for q in observed:
            queue = label(q.queue)
            summed = counts[queue]
            for state_value, n in q.depth.items():
                summed[state_value] = summed.get(state_value, 0) + n
            if q.oldest_ready_age is not None and q.oldest_ready_age > ages[queue]:
                ages[queue] = q.oldest_ready_age
            dead_jobs[queue] += q.dead
            if q.paused and queue != OTHER_QUEUES:  # "(other)" sums many: none of them is one
                paused_queues.add(queue)
            for job, kind, n in q.limit_waiting:
                shown = self.labels.pair(q.queue, job)
                put_off[(*shown, kind)] = put_off.get((*shown, kind), 0) + n
        for queue, summed in counts.items():
            for state_value in _STATES:
                depth.add_metric([queue, state_value], summed.get(state_value, 0))
        for queue, age in ages.items():
            oldest.add_metric([queue], age)
        for queue, n in dead_jobs.items():
            dead.add_metric([queue], n)
        for labels, n in put_off.items():
            waiting.add_metric(list(labels), n)
        for queue in sorted(paused_queues):
            paused.add_metric([queue], 1.0)
        running = GaugeMetricFamily(
            f"{PREFIX}running", "Jobs running in this process's workers", labels=["queue"]
        )
        free = GaugeMetricFamily(
            f"{PREFIX}free_slots",
            "Slots free in this process's workers (concurrency less running)",
            labels=["queue"],
        )
        by_label: dict[str, tuple[int, int]] = {}
        for queue, (busy, limit) in sorted(slots.items()):
            slot_label = label(queue)
            had = by_label.get(slot_label, (0, 0))
            by_label[slot_label] = (had[0] + busy, had[1] + limit)
        for queue, (busy, limit) in by_label.items():
            running.add_metric([queue], busy)
            free.add_metric([queue], max(limit - busy, 0))
        yield from (depth, oldest, dead, waiting, running, free, paused)

    def _slots(self) -> dict[str, tuple[int, int]]:
        """Each queue's running jobs and slots, summed over this process's workers."""
        summed: dict[str, tuple[int, int]] = {}
        for reader in list(self.slots.values()):
            for queue, (busy, limit) in reader().items():
                had = summed.get(queue, (0, 0))
                summed[queue] = (had[0] + busy, had[1] + limit)
        return summed


def _add(histogram: _Histogram, counts: Sequence[int], total: float) -> None:
    histogram.counts = list(map(operator.add, histogram.counts, counts))
    histogram.sum += total


def _exposed(
    histogram: _Histogram, bounds: tuple[float, ...]
) -> tuple[list[tuple[str, float]], float]:
    """The cumulative buckets (``le`` as prometheus-client writes it) and the sum."""
    buckets: list[tuple[str, float]] = []
    seen = 0
    for bound, n in zip((*bounds, math.inf), histogram.counts, strict=True):
        seen += n
        buckets.append((floatToGoString(bound), seen))  # type: ignore[no-untyped-call]
    return buckets, histogram.sum


_default: Metrics | None = None


def default_metrics(*, run_buckets: Sequence[float] | None = None) -> Metrics:
    """The process-wide metrics on prometheus_client's default registry (the one explicit
    default: a second registration of the same names there would raise). ``run_buckets``
    sets the run-time histogram's bounds when it is made (the CLI's ``--run-buckets``)."""
    global _default
    if _default is None:
        _default = Metrics(run_buckets=RUN_BUCKETS if run_buckets is None else run_buckets)
    elif run_buckets is not None and checked_buckets(run_buckets) != _default.run_buckets:
        raise ConfigError(
            "the process's metrics were made already, with other run-time buckets",
            fix="set the buckets before anything in the process uses the default metrics",
        )
    return _default
