# The metrics' bounds (issue 46): the run-time histogram spans milliseconds to hours and can be
# set, the series stay bounded whatever the number of queues and jobs a worker claims from or
# sees, and the counts the worker keeps without a lock (issue 44) add up to the same values:
# folded at scrape, kept across a worker's restart, never moved from one series to another.
from __future__ import annotations

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobs_trio import OutcomeKind, Registry
from jobs_trio._cli.main import main
from jobs_trio._core.errors import ConfigError
from jobs_trio._core.metrics import (
    MAX_JOB_LABELS,
    MAX_QUEUE_LABELS,
    OTHER_JOBS,
    OTHER_QUEUES,
    RUN_BUCKETS,
    Metrics,
)
from jobs_trio._core.records import QueueStats
from tests.helpers.worker_helpers import fresh_metrics, trio_driver, worker

QUEUES = 5_000


def scraped(metrics: Metrics) -> tuple[bytes, list[tuple[str, dict[str, str], float]]]:
    body = generate_latest(metrics.registry)
    return body, [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    ]


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(
        value
        for sample, have, value in samples
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


async def test_the_run_time_buckets_reach_hours_by_default(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("reports.nightly", queue="reports", timeout=3 * 3600)
    async def nightly(ctx: object, payload: None) -> None:
        await trio.sleep(2 * 3600)  # two hours: past every bucket of prometheus-client's

    driver = trio_driver()
    await nightly.enqueue(driver)
    metrics = fresh_metrics()
    w = worker(driver, registry, metrics=metrics, stats_interval=None, lease=3600)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(3 * 3600)
        await w.stop()
    _, samples = scraped(metrics)
    bounds = {
        labels["le"]
        for name, labels, _ in samples
        if name == "jobs_trio_run_seconds_bucket" and labels["job"] == "reports.nightly"
    }
    assert {"0.001", "3600.0", "14400.0", "+Inf"} <= bounds, sorted(bounds)
    labels = {"job": "reports.nightly", "queue": "reports"}
    assert total(samples, "jobs_trio_run_seconds_bucket", le="3600.0", **labels) == 0
    assert total(samples, "jobs_trio_run_seconds_bucket", le="14400.0", **labels) == 1
    assert total(samples, "jobs_trio_run_seconds_sum", **labels) == pytest.approx(7200)


def test_the_run_time_buckets_can_be_set() -> None:
    metrics = Metrics(CollectorRegistry(), run_buckets=(0.5, 30))
    metrics.attempt_finished("q", "j", OutcomeKind.COMPLETED, 10.0)
    _, samples = scraped(metrics)
    bounds = [b["le"] for n, b, _ in samples if n == "jobs_trio_run_seconds_bucket"]
    assert bounds == ["0.5", "30.0", "+Inf"]
    assert [v for n, _, v in samples if n == "jobs_trio_run_seconds_bucket"] == [0, 1, 1]
    assert RUN_BUCKETS[0] <= 0.001 and RUN_BUCKETS[-1] >= 3600


@pytest.mark.parametrize("buckets", [(), (1, 1), (5, 1), (0, 1), (1, float("inf"))])
def test_bad_run_time_buckets_are_refused(buckets: tuple[float, ...]) -> None:
    with pytest.raises(ConfigError, match="buckets"):
        Metrics(CollectorRegistry(), run_buckets=buckets)


def test_the_cli_refuses_bad_run_buckets_with_the_flag_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["worker", "x:y", "--db", "memory://", "--run-buckets", "10,1"]) == 2
    err = capsys.readouterr().err
    assert "--run-buckets" in err and "increasing" in err


def test_a_worker_claiming_5000_queues_exports_a_bounded_scrape() -> None:
    """What a worker claiming from 5,000 queues, each with its own job, exports once one job of
    each has run and the queues were observed: 16.2 MB and 256,668 series before (issue 46)."""
    metrics = fresh_metrics()
    queues = [f"q{n:05}" for n in range(QUEUES)]
    metrics.watch_slots("w1", lambda: {q: (0, 4) for q in queues})
    metrics.jobs_declared((q, f"job.{q}") for q in queues)
    tally = metrics.tally()
    for q in queues:
        tally.run_started(q, 0.2)
        tally.attempt_finished(q, f"job.{q}", OutcomeKind.COMPLETED, 0.01)
    tally.attempt_finished("q00001", "job.q00001", OutcomeKind.RETRIED, 0.01)
    metrics.queues_observed([QueueStats(q, {"ready": 2}, 2, 1.0, 1) for q in queues])
    body, samples = scraped(metrics)
    assert len(body) < 200_000, len(body)
    labelled = {labels["queue"] for _, labels, _ in samples if "queue" in labels}
    assert len(labelled) == MAX_QUEUE_LABELS + 1 and OTHER_QUEUES in labelled
    jobs = {labels["job"] for _, labels, _ in samples if "job" in labels}
    assert len(jobs) <= MAX_JOB_LABELS + 1 and OTHER_JOBS in jobs
    assert len(samples) < 3_000, len(samples)
    # Summed, never dropped: every attempt, wait and ready job is in the totals.
    assert total(samples, "jobs_trio_jobs_total", outcome="ok") == QUEUES
    assert total(samples, "jobs_trio_jobs_total", outcome="failed") == 1
    assert total(samples, "jobs_trio_attempts_total") == QUEUES + 1
    assert total(samples, "jobs_trio_run_seconds_count") == QUEUES + 1
    assert total(samples, "jobs_trio_wait_seconds_count") == QUEUES
    assert total(samples, "jobs_trio_queue_depth", state="ready") == 2 * QUEUES
    assert total(samples, "jobs_trio_free_slots") == 4 * QUEUES
    # The retry of a labelled job is on its own series.
    labels = {"queue": "q00001", "job": "job.q00001"}
    assert total(samples, "jobs_trio_jobs_total", outcome="failed", **labels) == 1


def test_a_label_once_given_is_kept_and_counts_never_move() -> None:
    metrics = Metrics(CollectorRegistry(), max_queue_labels=2, max_job_labels=2)
    tally = metrics.tally()
    tally.attempt_finished("zz", "late.first", OutcomeKind.COMPLETED, 0.1)
    _, first = scraped(metrics)
    # Queues that sort before it arrive later: "zz" keeps its label and its count.
    for queue in ("aa", "bb", "cc"):
        tally.attempt_finished(queue, f"job.{queue}", OutcomeKind.COMPLETED, 0.1)
    tally.attempt_finished("zz", "late.first", OutcomeKind.COMPLETED, 0.1)
    _, second = scraped(metrics)
    zz = {"queue": "zz", "job": "late.first"}
    assert total(first, "jobs_trio_jobs_total", outcome="ok", **zz) == 1
    assert total(second, "jobs_trio_jobs_total", outcome="ok", **zz) == 2
    # One more label each: "aa" (first of the newcomers); "bb" and "cc" are (other).
    assert total(second, "jobs_trio_jobs_total", outcome="ok", queue="aa") == 1
    other = {"queue": OTHER_QUEUES, "job": OTHER_JOBS}
    assert total(second, "jobs_trio_jobs_total", outcome="ok", **other) == 2


async def test_a_restarted_worker_keeps_counting_from_where_it_was(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("mail.send", queue="mail")
    async def send(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    metrics = fresh_metrics()
    w = worker(driver, registry, metrics=metrics, stats_interval=None)
    seen = []
    for _ in range(2):
        await send.enqueue_many(driver, [None, None])
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.sleep(1)
            await w.stop()
        _, samples = scraped(metrics)
        seen.append(total(samples, "jobs_trio_jobs_total", outcome="ok", job="mail.send"))
        # Retired, not kept live: a run's tally is folded into the totals once it ends.
        assert len(metrics._collected._live) == 1  # the shared tally alone
    assert seen == [2, 4]
