# docs/grafana/jobs_trio.json, the sample dashboard (issue 36): valid JSON Grafana imports, and
# every series a panel queries is one jobs_trio exports, so a renamed metric fails here rather
# than as an empty panel in someone's Grafana.
from __future__ import annotations

import json
import re

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobs_trio import OutcomeKind
from jobs_trio._core.records import OutboxStats, QueueStats
from tests.helpers.process_helpers import ROOT
from tests.helpers.worker_helpers import fresh_metrics

DASHBOARD = ROOT / "docs" / "grafana" / "jobs_trio.json"


def exported() -> set[str]:
    """Every sample name the metrics export once each has been used."""
    metrics = fresh_metrics()
    metrics.attempt_finished("q", "j", OutcomeKind.COMPLETED, 0.1)
    metrics.run_started("q", 0.5)
    metrics.task_fired("t")
    metrics.task_skipped("t", 1)
    metrics.jobs_pruned.inc()
    metrics.outbox_observed(OutboxStats(1, 2.0))
    # A paused queue too: its gauge has a series only while a queue is paused.
    metrics.queues_observed(
        [
            QueueStats("q", {"ready": 1}, 1, 1.0, 0, (("j", "slot", 1),)),
            QueueStats("held", {"ready": 1}, 1, 1.0, 0, paused=True),
        ]
    )
    metrics.watch_slots("w", lambda: {"q": (1, 2)})
    scraped = generate_latest(metrics.registry).decode()
    return {
        sample.name
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
    }


def test_every_panel_queries_series_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "jobs-trio" and dashboard["panels"]
    names = exported()
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            queried |= set(re.findall(r"\bjobs_trio_[a-z_]+", target["expr"]))
    queried |= set(re.findall(r"\bjobs_trio_[a-z_]+", json.dumps(dashboard["templating"])))
    assert queried, "no panel queries a jobs_trio series"
    assert queried <= names, sorted(queried - names)
