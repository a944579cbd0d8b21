# The SQLite hot path reads the jobs table by index at any depth, also once ANALYZE has run: the
# query plan of every statement a worker runs, captured as the driver runs it, over a deep file.
# Apart from test_sqlite_driver.py because it seeds a deep file and reads plans, not behaviour.
from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from jobs_trio._core.records import Complete, StepRecord, StepStatus
from jobs_trio.drivers.sqlite import open_sqlite_driver
from jobs_trio.testing.conformance.helpers import new_job

WAITING = 100_000
NOW = 1_000_000_000.0  # in the past: every seeded job is due


def _seed(path: Path, *, analyze: bool) -> None:
    """A queue of WAITING ready jobs (a backlog just enqueued), then ANALYZE if asked: statistics
    that say a queue is all 'ready' are what made SQLite scan the table for running rows."""
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO jobs (id, name, queue, state, payload, priority, attempts,"
            " max_attempts, run_at, created_at, updated_at) VALUES (?, 'j', 'default', 'ready',"
            " '{}', 0, 0, 3, ?, ?, ?)",
            ((f"w{i:08d}", NOW - WAITING + i, NOW, NOW) for i in range(WAITING)),
        )
        if analyze:
            conn.execute("ANALYZE")
    conn.close()


def _unbounded_reads(path: Path, statements: list[str]) -> list[str]:
    """Each statement whose plan reads the jobs table other than by an index search."""
    found = []
    with sqlite3.connect(path) as conn:
        for sql in dict.fromkeys(statements):
            if sql.split(None, 1)[0].upper() in ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA"):
                continue
            for row in conn.execute("EXPLAIN QUERY PLAN " + sql):
                detail: str = row[3]
                if " jobs" in f" {detail}" and not detail.startswith("SEARCH jobs USING"):
                    found.append(f"{detail}: {sql[:90]}")
    conn.close()
    return found


@pytest.mark.parametrize("analyze", [False, True])
async def test_every_hot_path_statement_reads_a_deep_file_by_index(
    tmp_path: Path, analyze: bool
) -> None:
    path = tmp_path / "jobs.db"
    async with open_sqlite_driver(f"sqlite:///{path}") as driver:
        await driver.enqueue([new_job()])  # the schema, made by the driver
    _seed(path, analyze=analyze)
    statements: list[str] = []
    async with open_sqlite_driver(f"sqlite:///{path}") as driver:
        # Every statement this connection runs, with its values bound in (expanded SQL).
        driver._conn.set_trace_callback(statements.append)
        claims = await driver.claim(["default"], 10, lease=30, worker_id="w1")
        assert len(claims) == 10
        await driver.renew([c.lease for c in claims], lease=30)
        step = StepRecord(name="s", status=StepStatus.DONE, started_at=NOW, finished_at=NOW)
        assert await driver.save_step(claims[0].lease, step)
        await driver.load_steps(claims[0].job_id)
        await driver.settle([Complete(c.lease, result="null") for c in claims])
        await driver.wait_for_work(["default"], timeout=0.01)
        await driver.enqueue([new_job(key="k")])
        driver._conn.set_trace_callback(None)
    assert len(statements) > 10
    unbounded = _unbounded_reads(path, statements)
    assert not unbounded, "\n".join(unbounded)
