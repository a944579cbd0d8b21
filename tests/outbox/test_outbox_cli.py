# `jobs-trio outbox`: what an operator reads about an outbox (rows pending, the relay's lag).
from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

import jobs_trio
from jobs_trio._cli.main import main
from jobs_trio.testing.conformance.helpers import new_job


def test_outbox_command_shows_pending_rows_and_the_lag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    assert main(["outbox", "--db", url]) != 0  # no database there: nothing is created

    async def write() -> None:
        # Written long ago on the driver's clock: the CLI reads the lag on the wall clock.
        async with jobs_trio.open_driver(url, clock=lambda: 1000.0) as app_db:
            await app_db.outbox_write([new_job(), new_job()])

    trio.run(write)
    capsys.readouterr()
    assert main(["outbox", "--db", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pending"] == 2 and shown["oldest_age"] > 0
    assert main(["outbox", "--db", url]) == 0
    assert capsys.readouterr().out.startswith("2 pending; the oldest has waited")
