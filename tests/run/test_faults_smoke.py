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
