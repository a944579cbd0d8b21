# The PostgreSQL hot path reads the jobs table by index at any depth: the plan of every statement
# a worker runs, as the driver prepares it on its own pooled connection, over a deep table.
# Apart from test_postgres_driver.py because it seeds a few hundred thousand rows (once, here).
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from jobs_trio._core.operator_transitions import OPERATOR_CANCEL_ERROR
from jobs_trio.drivers._rules import (
    KILLED_WORKER_ERROR,
    LAPSED_ERROR,
    ORPHANED_ERROR,
    ORPHANED_TOO_OFTEN_ERROR,
)
from tests.conftest import require_postgres

pytestmark = pytest.mark.postgres

pytest.importorskip("trio_asyncio")
pytest.importorskip("asyncpg")

from jobs_trio.drivers.postgres import PostgresDriver, open_postgres_driver  # noqa: E402

# Deep enough that a plan whose cost grows with the table (a hash join over a sequential scan,
# a walk of a whole index) is the one the planner picks when the statement leaves it the
# choice: with 1,000,000 waiting that was 340 ms of a 420 ms claim (issue 19).
WAITING = 200_000
FINISHED = 50_000
RUNNING = 200  # half of them lapsed, a quarter of those out of attempts
NOW = 2_000_000_000.0

# Every statement a worker runs while it works through a backlog, with arguments of the shape
# it passes (ids of rows that exist, so a plan is made for a real batch).
RUNNING_IDS = [f"r{i:07d}" for i in range(50)]
TOKENS = ["t"] * len(RUNNING_IDS)
HOT_PATH: dict[str, tuple[Any, ...]] = {
    "claim": (
        NOW,
        ["default", "other"],
        50,
        30.0,
        "w1",
        LAPSED_ERROR,
        KILLED_WORKER_ERROR,
        [40, 10],
        [20, 10],  # free slots: the rest of each queue's cap claimed ahead
        NOW,  # lapsed leases up to now are rescued (-inf after an outage: none)
        ORPHANED_TOO_OFTEN_ERROR,
        ORPHANED_ERROR,
        False,  # not alone: a worker running jobs (suspects left out)
        OPERATOR_CANCEL_ERROR,
    ),
    "renew": (NOW, 30.0, RUNNING_IDS, TOKENS, TOKENS[:5]),  # five of them started since
    "lock_for_settle": (RUNNING_IDS,),
    # Each settle: ids, tokens, whether each hands its attempt back, then the kind's own.
    "settle_complete": (NOW, "ch", RUNNING_IDS, TOKENS, [False] * 50, ["null"] * 50),
    "settle_retry": (
        NOW,
        "ch",
        RUNNING_IDS,
        TOKENS,
        [False] * 50,
        [1.0] * 50,
        ["e"] * 50,
        ["c"] * 50,
    ),
    "settle_dead": (NOW, "ch", RUNNING_IDS, TOKENS, [False] * 50, ["e"] * 50),
    "settle_suspend": (
        NOW,
        "ch",
        RUNNING_IDS,
        TOKENS,
        [True] * 50,
        [1.0] * 50,
        ["shipped"] * 50,
        ["order-7"] * 50,  # the keys they wait for
        ["c"] * 50,
        [7] * 50,  # the marks of the looks before the suspends (events past them wake)
    ),
    "settle_park": (NOW, "ch", RUNNING_IDS, TOKENS, [True] * 50, ["r"] * 50, ["c"] * 50),
    "settle_cancel": (NOW, "ch", RUNNING_IDS, TOKENS, [False] * 50, ["e"] * 50),
    "save_step": (RUNNING_IDS[0], "t", "s", "done", NOW, NOW, "1", None, None, None),
    "load_steps": (RUNNING_IDS[0],),
    "next_due": (["default", "other"], float("-inf"), False),
    "enqueue": (
        NOW,
        ["n1"],
        ["j"],
        ["default"],
        ["{}"],
        [0],
        [3],
        [0.0],
        ["k"],
        [None],  # context
        "ch",
        [None],
        [None],
        [None],
        [None],
        [None],
    ),
    "live_key_holders": (["k"],),
    "claim_limited_jobs": (NOW, RUNNING_IDS),
    "get_job": (RUNNING_IDS[0],),
}
# Each settle's attempt notes come last (postgres_sql.NOTE_TYPES): attempt, outcome, worker id,
# seconds, traceback; what the worker passes for every run.
NOTES = ([1] * 50, ["completed"] * 50, ["w1"] * 50, [0.5] * 50, [None] * 50)
HOT_PATH.update(
    {name: (*args, *NOTES) for name, args in HOT_PATH.items() if name.startswith("settle_")}
)
# A settle batch carried by the claim (settle_and_claim): the claim's arguments, then the settle's
# after its `now`.
HOT_PATH.update(
    {
        f"settle_claim_{name.removeprefix('settle_')}": (*HOT_PATH["claim"], *args[1:])
        for name, args in list(HOT_PATH.items())
        if name.startswith("settle_")
    }
)

# The plan modes a pool may run in (the driver forces generic plans; a custom plan is what a
# fresh connection makes for its first executions), and the sort setting the pool turns off
# and on: the plan must not hang on either.
CONFIGURATIONS = [
    ("force_generic_plan", None),
    ("force_custom_plan", None),
    ("force_generic_plan", "on"),
    ("force_custom_plan", "on"),
]


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "'-Infinity'" if value < 0 else "'Infinity'"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]"
    raise TypeError(value)


def scans_of(plan: dict[str, Any], table: str) -> Iterator[dict[str, Any]]:
    """Every node of ``plan`` that reads ``table``."""
    if plan.get("Relation Name") == table:
        yield plan
    for child in plan.get("Plans", ()):
        yield from scans_of(child, table)


# Partial indexes whose rows are the jobs in flight (running, lapsed or not): bounded by the
# fleet's concurrency, not by the backlog, so walking one whole is fine (a custom plan may hash
# the running rows against a settle batch instead of probing the primary key per row).
IN_FLIGHT_INDEXES = {"jobs_leased"}


# Indexes led by a time no hot statement filters on: a plan that reads one walks it whole, its
# "Index Cond" on a later column (the id) notwithstanding. Made on an empty table's statistics,
# the claim's UPDATE found its rows by id through jobs_created: 14 ms a claim at 20,000 jobs.
WHOLE_WALKS = {"jobs_created", "jobs_finished"}


def unbounded(node: dict[str, Any]) -> bool:
    """A read whose cost grows with the table: a sequential scan, an index over waiting or
    finished rows walked whole (no index condition: with sorts off, the planner walked the
    primary key to get id order), or an index no hot statement's condition leads."""
    if node["Node Type"] == "Seq Scan":
        return True
    if node.get("Index Name") in WHOLE_WALKS:
        return True
    return (
        node["Node Type"] in ("Index Scan", "Index Only Scan")
        and "Index Cond" not in node
        and node.get("Index Name") not in IN_FLIGHT_INDEXES
    )


def _fresh_driver(pg_schema: str) -> AbstractAsyncContextManager[PostgresDriver]:
    """A driver on a schema of its own, migrated, one pooled connection (whose plans are read)."""
    return open_postgres_driver(
        require_postgres(), schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=1
    )


async def _seed(driver: PostgresDriver) -> None:
    jobs = f'"{driver.schema}".jobs'

    async def seed(conn: Any) -> None:
        columns = (
            "id, name, queue, state, payload, priority, attempts, max_attempts, run_at,"
            " created_at, updated_at, lease_until, token, worker_id, result"
        )
        await conn.execute(
            f"INSERT INTO {jobs} ({columns})"
            " SELECT 'w' || lpad(g::text, 7, '0'), 'j', CASE WHEN g % 10 = 0 THEN 'other'"
            " ELSE 'default' END, 'ready', '{}', g % 3, 0, 3, $1::float8 - $2 + g, $1, $1,"
            " NULL, NULL, NULL, NULL FROM generate_series(1, $2) AS g",
            NOW,
            WAITING,
        )
        await conn.execute(
            f"INSERT INTO {jobs} ({columns})"
            " SELECT 'c' || lpad(g::text, 7, '0'), 'j', 'default', 'completed', '{}', 0, 1, 3,"
            " $1::float8 - g, $1, $1, NULL, NULL, NULL, 'null' FROM generate_series(1, $2) AS g",
            NOW,
            FINISHED,
        )
        await conn.execute(
            f"INSERT INTO {jobs} ({columns})"
            " SELECT 'r' || lpad(g::text, 7, '0'), 'j', 'default', 'running', '{}', 0,"
            " CASE WHEN g % 4 = 0 THEN 3 ELSE 1 END, 3, $1::float8 - 100, $1, $1,"
            " $1::float8 + CASE WHEN g % 2 = 0 THEN -5 ELSE 5 END, 't', 'w0', NULL"
            " FROM generate_series(0, $2 - 1) AS g",
            NOW,
            RUNNING,
        )
        await conn.execute(f"ANALYZE {jobs}")

    await driver.bridge.run(seed, what="seeding a deep queue")


async def _plan(
    driver: PostgresDriver, name: str, args: tuple[Any, ...], mode: str, sort: str | None
) -> dict[str, Any]:
    """The plan of statement ``name`` as prepared on one of the driver's pooled connections
    (its session settings), in plan mode ``mode``, with enable_sort set to ``sort`` if given."""
    sql = driver._sql[name]

    async def explain(conn: Any) -> Any:
        # SET LOCAL: gone with this transaction, so the pooled connection goes back as it was.
        await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
        if sort is not None:
            await conn.execute(f"SET LOCAL enable_sort = {sort}")
        statement = await conn.prepare(sql)
        types = [
            await conn.fetchval("SELECT format_type($1, NULL)", t.oid)
            for t in statement.get_parameters()
        ]
        values = ", ".join(f"{_literal(v)}::{t}" for v, t in zip(args, types, strict=True))
        # EXPLAIN EXECUTE of the statement the driver's connection prepared: its own plan,
        # generic or custom as the mode says. Never executed, so nothing is changed.
        return await conn.fetchval(
            f"EXPLAIN (FORMAT JSON) EXECUTE {statement.get_name()}({values})"
        )

    text = await driver.bridge.run(explain, what=f"explaining {name}", transaction=True)
    plan: dict[str, Any] = json.loads(text)[0]["Plan"]
    return plan


async def test_every_hot_path_statement_reads_a_deep_table_by_index(pg_schema: str) -> None:
    async with _fresh_driver(pg_schema) as driver:
        await _seed(driver)
        unbounded_reads = []
        for mode, sort in CONFIGURATIONS:
            for name, args in HOT_PATH.items():
                plan = await _plan(driver, name, args, mode, sort)
                for node in scans_of(plan, "jobs"):
                    if unbounded(node):
                        unbounded_reads.append(
                            f"{name} ({mode}, enable_sort={sort or 'as the pool sets it'}): "
                            f"{node['Node Type']} using {node.get('Index Name', '-')}"
                        )
        assert not unbounded_reads, "\n".join(unbounded_reads)


async def test_plans_made_while_the_table_was_empty_still_read_by_index(pg_schema: str) -> None:
    """A pooled connection keeps the generic plan it made at a statement's first execution for
    as long as it lives. A worker started on an empty, vacuumed table made them on statistics
    where every read costs nothing: the claim read the whole table four times (sequential scans,
    now off in the pool), then, in their place, found its rows by id by walking the newest-first
    index whole (its second key column was the id until migration 0008): slower with every
    finished job, 17 ms a claim after 14,000 (issue 16's steady-load gap)."""
    async with _fresh_driver(pg_schema) as driver:
        jobs = f'"{driver.schema}".jobs'

        async def analyze_empty(conn: Any) -> None:
            await conn.execute(f"VACUUM ANALYZE {jobs}")
            await conn.execute(f'VACUUM ANALYZE "{driver.schema}".limit_rows')

        await driver.bridge.run(analyze_empty, what="analyzing an empty table")
        unbounded_reads = []
        for name, args in HOT_PATH.items():
            plan = await _plan(driver, name, args, "force_generic_plan", None)
            unbounded_reads += [
                f"{name}: {node['Node Type']} using {node.get('Index Name', '-')}"
                for node in scans_of(plan, "jobs")
                if unbounded(node)
            ]
            # A run's fleet slot row is found by the run's token, never by walking every slot
            # row (one per slot of every limit key ever used).
            unbounded_reads += [
                f"{name}: limit_rows by {node.get('Index Name', node['Node Type'])}"
                for node in scans_of(plan, "limit_rows")
                if node["Node Type"] in ("Seq Scan", "Index Scan", "Index Only Scan")
                and node.get("Index Name") != "limit_rows_token"
            ]
        assert not unbounded_reads, "\n".join(unbounded_reads)


def nodes_of(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of ``plan``, itself first."""
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes_of(child)


def subplan(plan: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """The node of ``plan`` that is its subplan ``name`` (``CTE settled``)."""
    if plan.get("Subplan Name") == name:
        yield plan
    for child in plan.get("Plans", ()):
        yield from subplan(child, name)


def rescanned_per_row(plan: dict[str, Any]) -> Iterator[str]:
    """Every batch-sized input a nested loop reads again for each of its outer rows (a CTE
    or the batch's unnest on its inner side): a cost quadratic in the batch."""
    children = plan.get("Plans", ())
    if plan["Node Type"] == "Nested Loop":
        for child in children:
            if child.get("Parent Relationship") == "Inner" and child["Node Type"] in (
                "CTE Scan",
                "Function Scan",
            ):
                yield f"{child['Node Type']} on {child.get('Alias', '?')}"
    for child in children:
        yield from rescanned_per_row(child)


@pytest.mark.parametrize("statistics", ["empty", "deep"])
async def test_a_settle_reads_its_batch_once_whatever_the_statistics(
    pg_schema: str, statistics: str
) -> None:
    """Issue 44: with the statistics of a table whose running jobs were few when analyzed, the
    generic plan of every settle's UPDATE rescanned `locked` for each row of its batch (the IN
    pulled up into a nested-loop semi-join), forming a whole-row copy of each row it read:
    ~20% of the server's CPU a job at c=50."""
    async with _fresh_driver(pg_schema) as driver:
        if statistics == "deep":
            await _seed(driver)
        else:

            async def analyze_empty(conn: Any) -> None:
                await conn.execute(f'VACUUM ANALYZE "{driver.schema}".jobs')

            await driver.bridge.run(analyze_empty, what="analyzing an empty table")
        rescans = [
            f"{name}: {scan}"
            for name, args in HOT_PATH.items()
            if name.startswith("settle_")
            for settled in subplan(
                await _plan(driver, name, args, "force_generic_plan", None), "CTE settled"
            )
            for scan in rescanned_per_row(settled)
        ]
        assert not rescans, "\n".join(rescans)


async def test_a_settle_finds_its_rows_by_id_in_a_fleet_with_many_jobs_in_flight(
    pg_schema: str,
) -> None:
    """With the statistics of a fleet running 20,000 jobs, each settle finds its batch's rows
    by primary key: reading the running jobs' index instead costs every settle the whole
    fleet's in-flight work (5.4 ms a job for a settle of one, a review of issue 44 found, where
    the primary key took 1.2)."""
    async with _fresh_driver(pg_schema) as driver:
        jobs = f'"{driver.schema}".jobs'

        async def seed(conn: Any) -> None:
            await conn.execute(
                f"INSERT INTO {jobs} (id, name, queue, state, payload, priority, attempts,"
                " max_attempts, run_at, created_at, updated_at, lease_until, token, worker_id)"
                " SELECT 'f' || lpad(g::text, 7, '0'), 'j', 'default', 'running', '{}', 0, 1, 3,"
                " $1::float8, $1, $1, $1::float8 + 30 + g, 'f' || g, 'w9'"
                " FROM generate_series(1, 20000) AS g",
                NOW,
            )
            await conn.execute(f"VACUUM ANALYZE {jobs}")

        await driver.bridge.run(seed, what="seeding a fleet's running jobs")
        walks = []
        for mode, sort in CONFIGURATIONS:
            for name, args in HOT_PATH.items():
                if not name.startswith("settle_"):
                    continue
                plan = await _plan(driver, name, args, mode, sort)
                walks += [
                    f"{name} ({mode}, enable_sort={sort}): {node['Node Type']}"
                    f" using {node.get('Index Name', '-')}"
                    for settled in subplan(plan, "CTE settled")
                    for node in nodes_of(settled)
                    if node["Node Type"] == "Seq Scan"
                    or (
                        "Index Name" in node
                        and (node["Index Name"] != "jobs_pkey" or "Index Cond" not in node)
                    )
                ]
        assert not walks, "\n".join(walks)
