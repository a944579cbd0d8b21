# Prometheus metrics: attempts by outcome, run durations, queue depth, the outbox's backlog.
# Apart so the worker only says what happened; the names and labels are decided here.
from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from .attempt import OutcomeKind
from .records import OutboxStats, QueueStats

# Only these reach jobs_total: interrupted, suspended, lost, parked and cancelled attempts are
# not failures of the job, and counting them would spike `failed` on every deploy.
COUNTED_OUTCOMES = {
    OutcomeKind.COMPLETED: "ok",
    OutcomeKind.RETRIED: "failed",
    OutcomeKind.DEAD_LETTERED: "dead",
}

# The job label of an attempt whose name this deploy does not know (it was parked). Labelled by
# its name, every distinct unknown name read from the database would add children to every
# series for the life of the process: 3,000 names made /metrics 3.8 MB.
UNKNOWN_JOB = "unknown"


class Metrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.jobs_total = Counter(
            "jobs_total",
            "Attempts finished, by outcome",
            ["queue", "job", "outcome"],
            registry=registry,
        )
        self.run_seconds = Histogram(
            "jobs_run_seconds", "Time a job body ran", ["queue", "job"], registry=registry
        )
        self.queue_depth = Gauge(
            "queue_depth", "Jobs in a queue, by state", ["queue", "state"], registry=registry
        )
        self.queue_oldest_ready_seconds = Gauge(
            "queue_oldest_ready_seconds", "Age of the oldest due job", ["queue"], registry=registry
        )
        self.queue_dead_jobs = Gauge(
            "queue_dead_jobs", "Dead-lettered jobs kept", ["queue"], registry=registry
        )
        self.limit_waiting = Gauge(
            "jobs_limit_waiting",
            "Ready jobs a claim put off for a fleet limit: limit is 'slot' (runs at once) or"
            " 'rate' (starts per period)",
            ["queue", "job", "limit"],
            registry=registry,
        )
        # The waiting series last set, so one whose jobs are no longer waiting reads 0.
        self._waiting_seen: set[tuple[str, str, str]] = set()
        self.tasks_fired = Counter(
            "jobs_task_fires_total", "Cron task fires enqueued", ["task"], registry=registry
        )
        self.tasks_skipped = Counter(
            "jobs_task_missed_skipped_total",
            "Scheduled times of a cron task its missed-run policy skipped",
            ["task"],
            registry=registry,
        )
        self.jobs_pruned = Counter(
            "jobs_pruned_total", "Finished jobs deleted by retention", registry=registry
        )
        self.outbox_pending = Gauge(
            "outbox_pending", "Outbox rows written and not yet relayed", registry=registry
        )
        self.outbox_oldest_seconds = Gauge(
            "outbox_oldest_seconds",
            "Age of the oldest outbox row: how far the relay lags",
            registry=registry,
        )
        # labels() takes a lock and builds a key on every call: once per (queue, job, outcome)
        # here, instead of twice per finished attempt on the worker's hot path.
        self._finished: dict[tuple[str, str, OutcomeKind], tuple[Counter | None, Histogram]] = {}

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
            children = (counter, self.run_seconds.labels(queue=queue, job=job))
            self._finished[(queue, job, outcome)] = children
        counter, histogram = children
        if counter is not None:
            counter.inc()
        histogram.observe(seconds)

    def task_fired(self, task: str) -> None:
        self.tasks_fired.labels(task=task).inc()

    def task_skipped(self, task: str, count: int) -> None:
        self.tasks_skipped.labels(task=task).inc(count)

    def queues_observed(self, stats: Sequence[QueueStats]) -> None:
        for q in stats:
            for state, count in q.depth.items():
                self.queue_depth.labels(queue=q.queue, state=state).set(count)
            self.queue_oldest_ready_seconds.labels(queue=q.queue).set(q.oldest_ready_age or 0.0)
            self.queue_dead_jobs.labels(queue=q.queue).set(q.dead)
        waiting = {(q.queue, job, kind): n for q in stats for job, kind, n in q.limit_waiting}
        for queue, job, kind in self._waiting_seen | set(waiting):
            count = waiting.get((queue, job, kind), 0)
            self.limit_waiting.labels(queue=queue, job=job, limit=kind).set(count)
        self._waiting_seen = set(waiting)

    def outbox_observed(self, stats: OutboxStats) -> None:
        self.outbox_pending.set(stats.pending)
        self.outbox_oldest_seconds.set(stats.oldest_age or 0.0)


_default: Metrics | None = None


def default_metrics() -> Metrics:
    """The process-wide metrics on prometheus_client's default registry (the one explicit
    default: a second registration of the same names there would raise)."""
    global _default
    if _default is None:
        _default = Metrics()
    return _default
