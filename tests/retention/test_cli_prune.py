# `jobs-trio prune`: what it deletes and keeps on a real SQLite file, its ages, its refusal of a
# bad age, and its wait for (and report of) a worker holding the fleet's prune turn.
from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from jobs_trio._cli import prune as cli_prune
from jobs_trio._core.records import Complete, DeadLetter, PruneTurn
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.testing.conformance.helpers import new_job
from tests.ops.test_cli import Cli


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capsys)


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A file holding two completed jobs, one dead and one ready."""
    monkeypatch.delenv("JOBS_TRIO_DB", raising=False)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def fill() -> None:
        async with open_driver(url) as driver:
            await driver.enqueue([new_job(f"j.{i}") for i in range(4)])
            claims = await driver.claim(["default"], 3, lease=30.0, worker_id="w1")
            ends = [Complete(claims[0].lease), Complete(claims[1].lease)]
            await driver.settle([*ends, DeadLetter(claims[2].lease, "boom")])

    trio.run(fill)
    return url


def states(url: str) -> list[str]:
    async def read() -> list[str]:
        async with open_driver(url) as driver:
            return sorted(r.state.value for r in await driver.list_jobs())

    return trio.run(read)


def test_prune_deletes_finished_jobs_older_than_the_age_and_keeps_dead_ones(
    run: Cli, url: str
) -> None:
    assert run.ok("prune", "--db", url, "--older-than", "1h") == (
        "deleted 0 finished jobs (dead jobs kept)\n"
    )
    assert states(url) == ["completed", "completed", "dead", "ready"]
    assert run.ok("prune", "--db", url, "--older-than", "0s") == (
        "deleted 2 finished jobs (dead jobs kept)\n"
    )
    assert states(url) == ["dead", "ready"]
    out = run.ok("prune", "--db", url, "--older-than", "0", "--dead-older-than", "0", "--json")
    assert json.loads(out) == {"deleted": 1, "older_than": 0.0, "dead_older_than": 0.0}
    assert states(url) == ["ready"]


@pytest.mark.parametrize("bad", ["7x", "-1d", "", "1e9999", "d"])
def test_a_bad_age_is_refused_and_nothing_is_deleted(run: Cli, url: str, bad: str) -> None:
    err = run.fails("prune", "--db", url, "--older-than", bad, code="X_USAGE")
    assert "is not an age" in err or "expected one argument" in err
    assert states(url) == ["completed", "completed", "dead", "ready"]


def test_ages_read_with_their_units() -> None:
    assert [cli_prune.age(t) for t in ("90", "90s", "15m", "12h", "7d", "2w", "1.5h")] == [
        90.0,
        90.0,
        900.0,
        43200.0,
        604800.0,
        1209600.0,
        5400.0,
    ]


def test_prune_reports_a_turn_a_worker_holds_instead_of_pruning_beside_it(
    run: Cli, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def hold() -> None:
        async with open_driver(url) as driver:
            # A worker's pruner mid-turn: a full batch, so it holds the turn for its next.
            turn = PruneTurn("worker-1", keep_finished=0.0, keep_dead=None, limit=1, hold=600)
            assert (await driver.prune(turn)).more

    trio.run(hold)
    monkeypatch.setattr(cli_prune, "TURN_WAIT", 0.3)
    status, _, err = run("prune", "--db", url, "--older-than", "0")
    waiting, error = err.splitlines()
    assert status == 2
    assert waiting == "... a worker holds the prune turn; waiting"
    assert error.startswith("error [X_BUSY]: another pruner held the fleet's prune turn")
    assert states(url) == ["completed", "dead", "ready"]
