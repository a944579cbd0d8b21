# `jobs-trio outbox`: what an operator reads about an outbox (rows pending, the relay's lag).
from __future__ import annotations

import json
import re
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


def test_outbox_command_shows_the_rows_each_relay_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"

    async def take() -> None:
        async with jobs_trio.open_driver(url) as app_db:
            await app_db.outbox_write([new_job(), new_job(), new_job()])
            source = await app_db.outbox_source()
            for relay_id, lease in (("live-relay", 3600.0), ("paused-relay", 0.0)):
                ticket = await app_db.relay_ticket(source, relay_id=relay_id, lease=60.0)
                await app_db.outbox_claim(1, lease=lease, relay_id=relay_id, ticket=ticket)

    trio.run(take)
    capsys.readouterr()
    assert main(["outbox", "--db", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["pending"] == 3
    held = {h["relay_id"]: h for h in shown["held"]}
    assert (held["live-relay"]["rows"], held["live-relay"]["lapsed"]) == (1, False)
    assert 3590 < held["live-relay"]["lease_left"] <= 3600
    assert (held["paused-relay"]["rows"], held["paused-relay"]["lapsed"]) == (1, True)
    assert main(["outbox", "--db", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"  1 row held by relay live-relay: lease 59m5\ds left", lines[1])
    assert lines[2].startswith("  1 row held by relay paused-relay: lease lapsed ")
    assert lines[2].endswith("the next pass of any relay takes them over)")
