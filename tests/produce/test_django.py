# examples/django_enqueue.py run as a Django project runs (issue 47): a view's signup row and
# its job in one transaction.atomic() block on PostgreSQL (psycopg 3, Django's client); the
# block that commits leaves exactly one job, the one that raises none, and a Trio worker runs
# it. (Django on SQLite: docs/howto-producers.md's Django block, run by the docs test.)
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import jobs_trio
from tests.helpers.app_process import ROOT

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "django_enqueue.py"


def run_example(*argv: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.postgres
async def test_django_atomic_on_postgres(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    try:
        output = run_example(postgres_url, pg_schema, cwd=tmp_path)
        assert output == "welcome sent to ada@example.com\n"
    finally:
        async with jobs_trio.open_driver(
            postgres_url, schema=pg_schema, drop_schema_on_close=True
        ) as driver:
            assert [job.key for job in await driver.list_jobs()] == ["welcome:ada@example.com"]
