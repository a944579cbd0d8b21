# The project's rule: every bench/ script keeps working as the code changes. Each one run here
# as a user runs it (this interpreter, from the repository root), at the smallest size that
# still goes through all of it, and its figure lines looked for in what it prints: a script
# whose statement lost a parameter, or that imports a renamed internal, fails here, not on the
# day someone measures. The figures themselves are never judged. jobs_trio alone: the peers
# (pgqueuer, procrastinate) are installed in the bench environment only (noxfile.py's `bench`).
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import attrs
import pytest

from tests.conftest import require_postgres
from tests.helpers.process_helpers import ROOT

pytestmark = pytest.mark.slow

# Each script takes a few seconds at these sizes; this bounds a hang, with room for a loaded
# machine (the whole suite on four workers, two cores).
TIMEOUT = 120.0
# Written by `bench/run.py all` alone: no run here may touch them.
RESULTS = (ROOT / "bench" / "RESULTS.md", ROOT / "bench" / "RESULTS.json")
NUMBER = r"[0-9][0-9,.]*"
# enqueue_call.py's variants but the peer's (pgqueuer: the bench environment only).
ENQUEUE_VARIANTS = ("as-is", "listening", "raw-asyncio", "raw-trio-asyncio")


@attrs.frozen
class Script:
    """A script's smoke run: its arguments (split as a shell would; ``{db}``: the test server's
    URL, ``{tmp}``: the test's own folder), the lines it must print (regexes, each searched for
    in its stdout, ``NUMBER`` standing for a figure), and the files it writes under ``{tmp}``."""

    path: str
    args: str
    prints: tuple[str, ...]
    postgres: bool = True
    writes: tuple[str, ...] = ()


SCRIPTS = {
    "claim_floor": Script(
        "bench/claim_floor.py",
        "--db {db} --n 100 --rounds 1",
        tuple(
            rf"round 1 {kind} +{NUMBER} µs wall, backend CPU +{NUMBER} µs a statement"
            for kind in ("full", "minimal", "select1")
        ),
    ),
    "claim_churn": Script(
        "bench/claim_churn.py",
        "--db {db} --seconds 0.1 --rounds 20",
        (
            rf"apart +{NUMBER} jobs claimed: claim +{NUMBER} ms \(mean of 20\)",
            rf"apart +after VACUUM: +claim +{NUMBER} ms",
            rf"beside a feed +{NUMBER} jobs claimed: claim +{NUMBER} ms \(mean of 20\)",
            rf"beside a feed +after VACUUM: +claim +{NUMBER} ms",
        ),
    ),
    "cli_worker_cpu": Script(
        "bench/cli_worker_cpu.py",
        "--db {db} --jobs 200 --concurrency 10 --due-in 1",
        (rf"jobs-trio worker c=10: {NUMBER} µs CPU a job",),
    ),
    "cpu_targets": Script(
        "bench/cpu_targets.py",
        "--db {db} --jobs 200 --reps 1 --due-in 1",
        (
            rf"round 1: floor c=50 {NUMBER}, worker c=50 {NUMBER}, worker c=10 {NUMBER},",
            rf"\| worker SQLite c=10 \| {NUMBER} \| {NUMBER} \| ≤ 110, (met|missed) \|",
            rf"\| CLI SQLite c=10 \| {NUMBER} \| {NUMBER} \| ≤ 120, (met|missed) \|",
            rf"worker c=50 over the floor in the same round: {NUMBER} \(median {NUMBER}\)",
        ),
    ),
    "cpu_components": Script(
        "bench/cpu_components.py",
        "--db {db} --jobs 300 --concurrency 10 --rounds 1",
        (
            r"round 1: this tree \d+ µs a job",
            rf"\| the job's task and its cancel scope \(Trio\) \| {NUMBER} \|",
            rf"\| total \(runs\) \| \*\*{NUMBER}\*\* \({NUMBER}\) \|",
        ),
    ),
    "floor_worker": Script(
        "bench/floor_worker.py",
        "--db {db} --jobs 300 --concurrency 10 --batch 20",
        (
            rf"floor c=10 batch=20 {NUMBER} jobs/s, {NUMBER} µs CPU a job,"
            rf" GC {NUMBER} µs a job \(collections {NUMBER}/{NUMBER}/{NUMBER}\)",
        ),
    ),
    "metrics_scrape": Script(
        "bench/metrics_scrape.py",
        "--queues 60 --reps 1",
        (
            rf"/metrics of a worker claiming 60 queues: {NUMBER} bytes, {NUMBER} series,"
            rf" {NUMBER} ms",
        ),
        postgres=False,
    ),
    "dashboard_overview-sqlite": Script(
        "bench/dashboard_overview.py",
        "--queues 50 --reps 1",
        (
            rf"overview, 50 queues: {NUMBER} ms \(min {NUMBER}, max {NUMBER}\), {NUMBER} bytes",
            rf"/metrics after one observation: {NUMBER} bytes, {NUMBER} series",
        ),
        postgres=False,
    ),
    "dashboard_overview-postgres": Script(
        "bench/dashboard_overview.py",
        "--db {db} --queues 50 --reps 1",
        (
            rf"overview, 50 queues: {NUMBER} ms \(min {NUMBER}, max {NUMBER}\), {NUMBER} bytes",
            rf"/metrics after one observation: {NUMBER} bytes, {NUMBER} series",
        ),
    ),
    "deep_backlog-postgres": Script(
        "bench/deep_backlog.py",
        "--n 2000 --concurrency 10 --warmup 0.2 --window 0.5",
        (
            rf"enqueued in {NUMBER} s \({NUMBER} jobs/s\)",
            rf"postgres c=10 depth=2,000: .*{NUMBER} jobs/s from the first start",
        ),
    ),
    "deep_backlog-sqlite": Script(
        "bench/deep_backlog.py",
        "--db sqlite --n 2000 --concurrency 10 --warmup 0.2 --window 0.5",
        (rf"sqlite c=10 depth=2,000: .*{NUMBER} jobs/s from the first start",),
        postgres=False,
    ),
    "deep_queue": Script(
        "bench/deep_queue.py",
        "--lib jobs_trio --depth 2000 --concurrency 10 --warmup 0.2 --window 0.5",
        (
            rf"\| c=10 \| 2,000 \| jobs_trio \| {NUMBER} \| {NUMBER} \|"
            rf" {NUMBER} \((window|whole batch)\)",
        ),
    ),
    "enqueue_call": Script(
        "bench/enqueue_call.py",
        "--n 20 --rounds 1" + "".join(f" --variant {variant}" for variant in ENQUEUE_VARIANTS),
        tuple(
            rf"src {variant}: p50 {NUMBER} ms, p99 {NUMBER} ms \(median of 1 rounds\)"
            for variant in ENQUEUE_VARIANTS
        ),
    ),
    "event_race-postgres": Script(
        "bench/event_race.py",
        "--db {db} --jobs 20 --rate 200 --hold 0.01",
        (
            rf"waited for the poll: {NUMBER} of 20; never woke or never sent: {NUMBER}",
            rf"wake-up after the send: p50 {NUMBER} ms, p99 {NUMBER} ms, max {NUMBER} ms",
        ),
    ),
    "event_race-sqlite": Script(
        "bench/event_race.py",
        "--db sqlite --jobs 20 --rate 200",
        (
            rf"waited for the poll: {NUMBER} of 20; never woke or never sent: {NUMBER}",
            rf"wake-up after the send: p50 {NUMBER} ms, p99 {NUMBER} ms, max {NUMBER} ms",
        ),
        postgres=False,
    ),
    "idle_cost": Script(
        "bench/idle_cost.py",
        "--queues 1 --seconds 1",
        (rf"\| 1 \| {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER}% \|",),
    ),
    "migration_index": Script(
        "bench/migration_index.py",
        "--jobs 2000 --warmup 0.3 --driver postgres --driver sqlite",
        tuple(
            rf"{kind}: migration \[18\] took {NUMBER} s over 2,000 jobs: {NUMBER} enqueues during"
            rf" it, slowest {NUMBER} s; {NUMBER} failed; completed {NUMBER}/s before"
            for kind in ("postgres", "sqlite")
        ),
    ),
    "retention": Script(
        "bench/retention.py",
        "--finished 1000 --rounds 50 --driver postgres --driver sqlite",
        tuple(
            line
            for kind in ("postgres", "sqlite")
            for line in (
                rf"{kind}: claim, 2,000 live jobs: +p50 {NUMBER} ms, p99 {NUMBER} ms",
                rf"{kind}: claim, \+ 1,000 finished jobs: +p50 {NUMBER} ms",
                rf"{kind}: pruned 1,000 in {NUMBER} s \({NUMBER} jobs/s",
                rf"{kind}: claim, after the prune: +p50 {NUMBER} ms",
            )
        ),
    ),
    "round_trip": Script(
        "bench/round_trip.py",
        "--db {db} --n 50",
        (
            rf"claim, nothing due +{NUMBER} µs CPU +{NUMBER} µs wall per call",
            rf"get, a missing id +{NUMBER} µs CPU +{NUMBER} µs wall per call",
            *(
                rf"SELECT 1 {way} +{NUMBER} µs CPU +{NUMBER} µs wall per call \(round 3\)"
                for way in ("as a Task", "stepped", "read here")
            ),
        ),
    ),
    "run-throughput": Script(
        "bench/run.py",
        "throughput --lib jobs_trio --concurrency 10 --jobs 300 --reps 1"
        " --results {tmp}/RESULTS.md",
        (
            rf"\| throughput c=10 \| jobs/s processed \| {NUMBER} \|",
            rf"\| throughput c=10 \| jobs/s enqueued \(one batch\) \| {NUMBER} \|",
        ),
        # --results X also writes X's .json beside it (never bench/RESULTS.json).
        writes=("RESULTS.md", "RESULTS.json"),
    ),
    # PostgreSQL too: every run.py run first drops the leftovers of killed runs.
    "run-sqlite": Script(
        "bench/run.py",
        "sqlite --lib jobs_trio --jobs 300 --reps 1",
        (rf"\| SQLite c=10 \| jobs/s processed \| {NUMBER} \|",),
    ),
    "scale": Script(
        "bench/scale.py",
        "--lib jobs_trio --processes 1 --jobs 20000 --warmup 0.2 --window 0.5",
        (rf"\| 1 × 10 \| jobs_trio \| {NUMBER} \| {NUMBER} \| {NUMBER} \|",),
    ),
    "wake_path": Script(
        "bench/wake_path.py",
        "--n 20 --gap 0.03",
        (
            rf"claim_sent -> claim_answered +p50 +{NUMBER} ms +p90 +{NUMBER} ms",
            rf"returned -> started +p50 +{NUMBER} ms +p90 +{NUMBER} ms",
            # Matched by order: a job whose stage was missed (two jobs in one claim, on a
            # loaded machine) is left out of the count.
            r"\([0-9]+ jobs; ",
        ),
    ),
    "probe_path": Script(
        "bench/probe_path.py",
        "--rate 500 --n 20 --gap 0.03 --warmup 0.5",
        (
            rf"return->sent +p50 +-?{NUMBER} p75 +-?{NUMBER} p90 +-?{NUMBER} ms",
            rf"call->start +p50 +{NUMBER} p75 +{NUMBER} p90 +{NUMBER} ms",
            r"\([0-9]+ of 20 probes; ",
        ),
    ),
    "server_cpu": Script(
        "bench/server_cpu.py",
        "--db {db} --jobs 300 --batch 50 --reps 1",
        (rf"batch 50: PostgreSQL {NUMBER} µs a job, client {NUMBER} µs",),
    ),
    "sqlite_door": Script(
        "bench/sqlite_door.py",
        "--jobs 300 --concurrency 10",
        (
            rf"sqlite c=10 {NUMBER} jobs/s: door in a transaction {NUMBER}% of the run",
            rf"a door call \({NUMBER} calls",
        ),
        postgres=False,
    ),
    "worker_cpu": Script(
        "bench/worker_cpu.py",
        "--db {db} --jobs 300 --concurrency 10",
        (
            rf"c=10 {NUMBER} jobs/s, {NUMBER} µs CPU a job.*,"
            rf" GC {NUMBER} µs a job \(collections {NUMBER}/{NUMBER}/{NUMBER}\)",
        ),
    ),
    # Under valgrind: ~50 times slower, so fewer jobs (CI's machine has valgrind and gcc; the
    # script says so and measures nothing where they are missing).
    "worker_instructions": Script(
        "bench/worker_instructions.py",
        "--db {db} --jobs 100 --concurrency 10",
        (rf"c=10 {NUMBER} instructions a job|needs valgrind",),
    ),
    "worker_instructions_floor": Script(
        "bench/worker_instructions.py",
        "--floor --db {db} --jobs 100 --concurrency 10",
        (rf"floor c=10 {NUMBER} instructions a job|needs valgrind",),
    ),
    # Traced: ~60 times slower, so fewer jobs; the floor's loop and the worker both.
    "worker_ops": Script(
        "bench/worker_ops.py",
        "--db {db} --jobs 100 --concurrency 10 --top 3",
        (rf"worker c=10 {NUMBER} steps a job", rf"{NUMBER}  jobs_trio\b"),
    ),
    "worker_ops_floor": Script(
        "bench/worker_ops.py",
        "--floor --db {db} --jobs 100 --concurrency 10 --top 3",
        (rf"floor c=10 {NUMBER} steps a job",),
    ),
}


def test_every_script_is_run() -> None:
    """A script added to bench/ gets its smoke run here (the adapters and common.py are run
    by run.py, through the run-* cases)."""
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")}
    covered = {Path(s.path).name for s in SCRIPTS.values()}
    by_run = {p for p in scripts if p.startswith("lib_") or p == "common.py"}
    assert scripts - by_run == covered


def _server(url: str, script: str) -> str:
    """$BENCH_PG for ``script``: the test server's URL; retention.py and migration_index.py
    append their own database to it, so there the server alone."""
    if script in ("bench/retention.py", "bench/migration_index.py"):
        return urlunparse(urlparse(url)._replace(path=""))
    return url


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.postgres] if script.postgres else [])
        for name, script in SCRIPTS.items()
    ],
)
def test_script_runs_small(name: str, tmp_path: Path) -> None:
    script = SCRIPTS[name]
    env = dict(os.environ)
    db = ""
    if script.postgres:
        db = require_postgres()
        env["BENCH_PG"] = _server(db, script.path)
    before = [p.read_bytes() if p.exists() else None for p in RESULTS]
    args = [a.format(db=db, tmp=tmp_path) for a in shlex.split(script.args)]
    argv = [sys.executable, script.path, *args]
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    said = f"{' '.join(argv)} (exit {done.returncode})\n{done.stdout}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, said
    for line in script.prints:
        assert re.search(line, done.stdout), f"no line matching {line!r} in:\n{said}"
    after = [p.read_bytes() if p.exists() else None for p in RESULTS]
    changed = [p.name for p, was, now in zip(RESULTS, before, after, strict=True) if was != now]
    assert not changed, f"{name} rewrote bench/{', bench/'.join(changed)}"
    for written in script.writes:
        assert (tmp_path / written).is_file(), f"no {written} in {tmp_path}:\n{said}"
