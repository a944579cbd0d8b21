# The rules the drivers share are said once (drivers/rules.py) and every copy that must stay
# equal to them is checked here: the migrations' live-key index, the SQL rendered from them.
# Apart from the conformance suite because these are facts about the source, not behaviour.
from __future__ import annotations

import ast
import re
import typing
from importlib import resources
from pathlib import Path

import pytest

from jobs_trio._core.records import (
    CancelJob,
    Complete,
    DeadLetter,
    JobLimits,
    JobState,
    Lease,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from jobs_trio.drivers import _rows as rows
from jobs_trio.drivers import _rules as rules
from jobs_trio.drivers._postgres_sql import SETTLE_KINDS, load_statements

DRIVERS = resources.files("jobs_trio.drivers")
LEASE = Lease("j1", "t1")

# The partial unique index's predicate, as the first migration of each driver wrote it.
_LIVE_KEY_INDEX = re.compile(
    r"CREATE UNIQUE INDEX[^;]*jobs_live_key[^;]*WHERE key IS NOT NULL AND state IN (\([^)]*\))"
)


@pytest.mark.parametrize(
    "migration",
    ["sqlite_migrations/0001_jobs_steps_events.sql", "postgres_migrations/0001_initial.sql"],
)
def test_the_live_key_index_of_each_migration_lists_the_live_states(migration: str) -> None:
    # Migrations are history and keep their text; the enqueue's ON CONFLICT target is rendered
    # from rules.LIVE_STATES and must read as the index does (SQLite compares them as text).
    text = (DRIVERS / migration).read_text(encoding="utf-8")
    [listed] = _LIVE_KEY_INDEX.findall(text)
    assert listed == rules.LIVE_STATES_SQL


def test_the_postgres_statements_are_rendered_with_the_live_states() -> None:
    statements = load_statements("jobs_trio")
    for name in ("enqueue", "live_key_holders", "key_held_elsewhere"):
        assert f"state IN {rules.LIVE_STATES_SQL}" in statements[name]
    assert not [name for name, sql in statements.by_name.items() if "{live_states}" in sql]


def test_every_settlement_has_one_kind_and_postgres_a_statement_for_each() -> None:
    assert set(rules.SETTLEMENT_KINDS) == set(typing.get_args(Settlement))
    assert sorted(SETTLE_KINDS) == sorted({kind.name for kind in rules.SETTLEMENT_KINDS.values()})
    assert {f"settle_{kind}" for kind in SETTLE_KINDS} <= set(load_statements("jobs_trio").by_name)
    with pytest.raises(TypeError, match="not a settlement"):
        rules.effect(LEASE)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settlement", "hands_back"),
    [
        (Complete(LEASE, "1"), False),
        (Retry(LEASE, 1.0, "boom"), False),
        (Retry(LEASE, 0.0, "drained", hands_back=True), True),
        (DeadLetter(LEASE, "boom"), False),
        (Suspend(LEASE, 5.0, "paid"), True),
        (Park(LEASE, "unknown name"), True),
        (CancelJob(LEASE, "stop"), False),
    ],
)
def test_the_effects_table_hands_back_the_attempt_of_endings_that_are_not_failures(
    settlement: Settlement, hands_back: bool
) -> None:
    change = rules.effect(settlement)
    assert change.hands_back is hands_back
    # Every field a kind writes is a record field: the SQL drivers write them as columns.
    assert set(change.writes) <= set(rows.JOB_FIELDS)


def test_a_job_row_becomes_its_record_by_the_records_own_fields() -> None:
    row = ["j1", "n", "q", "ready", "{}", 0, 0, 3, 1.0, 1.0, 1.0, None, None, None, None, None]
    # SQLite stores the flag as 1, and a job's limits whole: no slot key beside 0 slots.
    limits = [None, 0, "api", 10, 60.0, "rate:api"]
    record = rows.job_record([*row, 1, None, None, *limits, "order-7", 2])
    assert record.state is JobState.READY and record.cancel_requested is True
    assert (record.wait_key, record.orphans) == ("order-7", 2)
    assert (record.slot_key, record.slots) == (None, None)  # as PostgreSQL stores it
    assert (record.rate_key, record.starts, record.per) == ("api", 10, 60.0)
    assert record.limits == JobLimits(rate_key="api", starts=10, per=60.0)
    with pytest.raises(ValueError):  # a row of other columns is refused, never misread
        rows.job_record(row)
    assert "token" not in rows.JOB_FIELDS  # a record never carries a fencing token


# A driver is its module and those named after it (postgres_bridge, sqlite_door, ...); every
# other module of drivers/ (rules, limit_rules, migration_files, contract) is shared.
DRIVER_FAMILIES = ("memory", "sqlite", "postgres")


def _driver_family(module: str) -> str | None:
    family = module.lstrip("_").split("_", 1)[0]
    return family if family in DRIVER_FAMILIES else None


# The one module that knows every driver: it opens the one a URL names.
BY_URL = "_open_driver"


def test_drivers_import_rules_never_each_other() -> None:
    folder = Path(str(DRIVERS))
    crossings = []
    for path in sorted(folder.glob("*.py")):
        if path.stem == BY_URL:
            continue
        family = _driver_family(path.stem)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                imported = _driver_family(node.module)
                if imported is not None and imported != family:
                    crossings.append(f"{path.name} imports .{node.module}")
    assert not crossings


def test_the_orphan_rule_hands_back_blames_the_alone_and_bounds_the_rest() -> None:
    from jobs_trio._core.records import JobState
    from jobs_trio.drivers._rules import ORPHAN_LIMIT, SUSPECT_AT, is_suspect, orphaning

    first = orphaning(0, alone=False)
    assert first.state is JobState.READY and first.hands_back and first.orphans == 1
    assert not is_suspect(first.orphans) and is_suspect(SUSPECT_AT)
    alone = orphaning(SUSPECT_AT, alone=True)
    assert alone.state is JobState.DEAD and not alone.hands_back
    assert alone.error.startswith("[X_KILLED_WORKER]")
    # Its innocent look-alikes named, with how to tell them apart: a suspect's worker
    # SIGKILLed by a deploy, or drained past a grace its body ignored by a worker that could not
    # unmark it (its abandonment's write failed), dead-letters it too.
    alikes = ("SIGKILLed by a deploy", "jobs.worker.alone-unmark-failed", "paused past the lease")
    for alike in alikes:
        assert alike in alone.error
    assert "the job did not kill it" in alone.error
    # Never alone (an older release's claims), yet bounded: the ORPHAN_LIMIT-th orphaning.
    assert orphaning(ORPHAN_LIMIT - 2, alone=False).state is JobState.READY
    bound = orphaning(ORPHAN_LIMIT - 1, alone=False)
    assert bound.state is JobState.DEAD and bound.error.startswith("[X_ORPHANED]")
