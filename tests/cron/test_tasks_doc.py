# docs/tasks.md's example runs as written: its worker fires the two-second task in real time.
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"


@pytest.mark.slow
def test_the_example_in_docs_tasks_runs_and_fires(tmp_path: Path) -> None:
    example = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert example is not None
    script = tmp_path / "example.py"
    script.write_text(example.group(1))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    beats = [line for line in done.stdout.splitlines() if line.startswith("beat ")]
    # Five seconds of a two-second schedule: two or three fires, each a different second.
    assert 2 <= len(beats) <= 3 and len(set(beats)) == len(beats), done.stdout
