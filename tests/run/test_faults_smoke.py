# The fault matrix (tests/faults/matrix.py, `nox -s faults`) keeps working as the code changes:
# its cheapest cell, SIGKILL chaos on SQLite, run small by its own command line in real worker
# processes; its row adds up, its kills are the ones recorded, and its table is written.
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.process_helpers import ROOT

pytestmark = pytest.mark.slow


def test_the_fault_matrix_runs_a_small_cell_and_writes_its_row(tmp_path: Path) -> None:
    rows_file, table_file = tmp_path / "rows.json", tmp_path / "table.md"
    command = [sys.executable, "-m", "tests.faults.matrix", "--small", "--cells", "sqlite/sigkill"]
    command += ["--json", str(rows_file), "--markdown", str(table_file)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    output = done.stdout + done.stderr
    [row] = json.loads(rows_file.read_text())
    assert (row["cell"], row["error"], row["skipped"]) == ("sqlite/sigkill", None, None), output
    # Every job enqueued is accounted for by the database, none lost.
    assert row["enqueued"] > 0 and row["completed"] + row["dead"] == row["enqueued"], output
    assert row["lost"] == 0, output
    # The chaos killed workers mid-run and started others: each kill is in the exit codes,
    # and every process that was not killed was stopped by SIGTERM and exited 0 or 70.
    [hits] = [note for note in row["notes"] if note.endswith("x SIGKILL")]
    kills = int(hits.split()[0])
    assert kills >= 2 and row["exits"].get("-9") == kills, output
    assert sum(row["exits"].values()) == 3 + kills, output
    assert set(row["exits"]) <= {"-9", "0", "70"}, output
    # The exit status is the verdict, and the table is printed and written.
    assert done.returncode == (1 if row["breaches"] else 0), output
    assert "sqlite/sigkill" in done.stdout
    assert "| sqlite/sigkill |" in table_file.read_text()


def test_a_cell_of_documented_at_least_once_breaches_only_on_an_overlap_or_an_unsaid_drop() -> None:
    # postgres/connection-limit cuts one worker off alone: its peers rerun its jobs once their
    # leases lapse and its late results are fenced and reported (docs/model.md). That "ran
    # twice" made every full run of the matrix exit 1 on documented behaviour.
    from tests.faults.ledger import Row
    from tests.faults.matrix import CELLS

    assert [c.name for c in CELLS if c.at_least_once] == ["postgres/connection-limit"]
    reported = Row("c", enqueued=300, completed=300, ran_twice=5, dropped=5, at_least_once=True)
    assert reported.breaches() == []
    assert Row("c", ran_twice=5, dropped=5).breaches() == ["ran twice"]
    unsaid = Row("c", ran_twice=5, dropped=5, unreported=1, at_least_once=True)
    assert unsaid.breaches() == ["ran twice", "unreported"]
    both = Row("c", ran_twice=1, overlaps=1, at_least_once=True)
    assert both.breaches() == ["ran twice", "overlaps"]
