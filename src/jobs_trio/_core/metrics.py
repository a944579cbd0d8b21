# Prometheus metrics: attempts by outcome, run and wait durations, queue depth, a worker's slots,
# the outbox's backlog. Apart so the worker only says what happened; the names, the labels and
# their bounds are decided here (docs/metrics.md lists them).
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

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

# The queue labels the queue gauges keep, at most: the queues this process's workers claim
# from always have their own, then other queues by name up to this many; the rest are summed
# under OTHER_QUEUES. Unbounded, 10,000 queues made /metrics 1.4 MB with 30,001 series.
MAX_QUEUE_LABELS = 100
OTHER_QUEUES = "(other)"

# Seconds from due to start: a job waiting behind others (or for a free slot) for minutes.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

SlotReader = Callable[[], Mapping[str, tuple[int, int]]]  # queue -> (running, slots)


class Metrics:
    """The process's metrics on ``registry``. prometheus-client's ``_created`` series (a gauge
    of each counter's creation time, which read as "jobs created") are turned off for the
    process: ``prometheus_client.disable_created_metrics()``, which applies to the
    application's own metrics too (docs/metrics.md)."""

    def __init__(
        self, registry: CollectorRegistry = REGISTRY, *, max_queue_labels: int = MAX_QUEUE_LABELS
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        self.jobs_total = Counter(
            f"{PREFIX}jobs_total",
            "Attempts finished that count for or against a job: ok, failed (retried), dead",
            ["queue", "job", "outcome"],
            registry=registry,
        )
        self.attempts_total = Counter(
            f"{PREFIX}attempts_total",
            "Attempts ended, by every outcome: completed, retried, dead-lettered, interrupted"
            " (drained), suspended, lost, cancelled, parked",
            ["queue", "job", "outcome"],
            registry=registry,
        )
        self.run_seconds = Histogram(
            f"{PREFIX}run_seconds", "Time a job body ran", ["queue", "job"], registry=registry
        )
        self.wait_seconds = Histogram(
            f"{PREFIX}wait_seconds",
            "Time from a job being due (enqueued, or its delay or backoff over) to its start",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
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
        # The queues' depth and this process's slots: read at each scrape from the last
        # observation and the live workers, so no series outlives its queue or its worker.
        self._observed = _Observed(max_queue_labels)
        registry.register(self._observed)
        # The outbox's gauges exist once a relay observes an outbox: a worker running no relay
        # exported two zeros that read as "the outbox is keeping up".
        self._outbox: tuple[Gauge, Gauge] | None = None
        # labels() takes a lock and builds a key on every call: once per (queue, job, outcome)
        # here, instead of three times per finished attempt on the worker's hot path.
        self._finished: dict[
            tuple[str, str, OutcomeKind], tuple[Counter | None, Counter, Histogram]
        ] = {}
        self._waits: dict[str, Histogram] = {}

    # What a worker reports.

    def watch_slots(self, worker: str, reader: SlotReader) -> None:
        """Export a worker's slots (``jobs_trio_running``, ``jobs_trio_free_slots``) from
        ``reader`` at each scrape while it runs; its queues keep their own labels."""
        self._observed.slots[worker] = reader

    def unwatch_slots(self, worker: str) -> None:
        self._observed.slots.pop(worker, None)

    def jobs_declared(self, jobs: Iterable[tuple[str, str]]) -> None:
        """Create ``jobs_total`` at 0 for each (queue, job) a worker runs: a rate over a series
        that appears only with its first failure reads as no failures at all."""
        for queue, job in jobs:
            for label in COUNTED_OUTCOMES.values():
                self.jobs_total.labels(queue=queue, job=job, outcome=label)

    def run_started(self, queue: str, waited: float) -> None:
        histogram = self._waits.get(queue)
        if histogram is None:
            histogram = self._waits[queue] = self.wait_seconds.labels(queue=queue)
        histogram.observe(max(waited, 0.0))

    def attempt_finished(self, queue: str, job: str, outcome: OutcomeKind, seconds: float) -> None:
        if outcome is OutcomeKind.PARKED:  # a name this deploy does not declare
            job = UNKNOWN_JOB  # before the cache too: it is keyed by label, not by name
        children = self._finished.get((queue, job, outcome))
        if children is None:
            label = COUNTED_OUTCOMES.get(outcome)
            counter = (
                None
                if label is None
                else self.jobs_total.labels(queue=queue, job=job, outcome=label)
            )
            children = (
                counter,
                self.attempts_total.labels(queue=queue, job=job, outcome=outcome.value),
                self.run_seconds.labels(queue=queue, job=job),
            )
            self._finished[(queue, job, outcome)] = children
        counter, every, histogram = children
        if counter is not None:
            counter.inc()
        every.inc()
        histogram.observe(seconds)

    def task_fired(self, task: str) -> None:
        self.tasks_fired.labels(task=task).inc()

    def task_skipped(self, task: str, count: int) -> None:
        self.tasks_skipped.labels(task=task).inc(count)

    def queues_observed(self, stats: Sequence[QueueStats]) -> None:
        self._observed.queues = tuple(stats)

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


class _Observed(Collector):
    """The gauges read at scrape time: each queue's depth by state (every state, 0 included),
    its oldest due job's age, its dead jobs, the jobs a fleet limit put off, from the last
    observation; and the slots of the workers running in this process."""

    def __init__(self, max_queue_labels: int) -> None:
        self.max_queue_labels = max_queue_labels
        self.queues: tuple[QueueStats, ...] = ()
        self.slots: dict[str, SlotReader] = {}

    def describe(self) -> Iterable[Metric]:
        return []  # collected at each scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        slots = self._slots()
        labelled = self._labelled(set(slots))
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
        counts: dict[tuple[str, str], int] = {}
        ages: dict[str, float] = {}
        dead_jobs: dict[str, int] = {}
        put_off: dict[tuple[str, str, str], int] = {}
        # A queue this process claims from has every state, at 0, before it holds any job.
        empty = [QueueStats(queue, {}, 0, None, 0) for queue in sorted(set(slots))]
        for q in [*self.queues, *empty]:
            queue = q.queue if q.queue in labelled else OTHER_QUEUES
            for state in JobState:
                key = (queue, state.value)
                counts[key] = counts.get(key, 0) + q.depth.get(state.value, 0)
            ages[queue] = max(ages.get(queue, 0.0), q.oldest_ready_age or 0.0)
            dead_jobs[queue] = dead_jobs.get(queue, 0) + q.dead
            for job, kind, n in q.limit_waiting:
                put_off[(queue, job, kind)] = put_off.get((queue, job, kind), 0) + n
        for (queue, state_value), n in counts.items():
            depth.add_metric([queue, state_value], n)
        for queue, age in ages.items():
            oldest.add_metric([queue], age)
        for queue, n in dead_jobs.items():
            dead.add_metric([queue], n)
        for labels, n in put_off.items():
            waiting.add_metric(list(labels), n)
        running = GaugeMetricFamily(
            f"{PREFIX}running", "Jobs running in this process's workers", labels=["queue"]
        )
        free = GaugeMetricFamily(
            f"{PREFIX}free_slots",
            "Slots free in this process's workers (concurrency less running)",
            labels=["queue"],
        )
        for queue, (busy, limit) in sorted(slots.items()):
            running.add_metric([queue], busy)
            free.add_metric([queue], max(limit - busy, 0))
        yield from (depth, oldest, dead, waiting, running, free)

    def _slots(self) -> dict[str, tuple[int, int]]:
        """Each queue's running jobs and slots, summed over this process's workers."""
        summed: dict[str, tuple[int, int]] = {}
        for reader in list(self.slots.values()):
            for queue, (busy, limit) in reader().items():
                had = summed.get(queue, (0, 0))
                summed[queue] = (had[0] + busy, had[1] + limit)
        return summed

    def _labelled(self, own: set[str]) -> set[str]:
        """The queues with a label of their own: this process's, then others by name."""
        room = max(self.max_queue_labels - len(own), 0)
        others = sorted(q.queue for q in self.queues if q.queue not in own)
        return own | set(others[:room])


_default: Metrics | None = None


def default_metrics() -> Metrics:
    """The process-wide metrics on prometheus_client's default registry (the one explicit
    default: a second registration of the same names there would raise)."""
    global _default
    if _default is None:
        _default = Metrics()
    return _default
