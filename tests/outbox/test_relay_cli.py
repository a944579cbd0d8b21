# `jobs-trio relay APP_URL JOBS_URL`: a relay process that moves the outbox until SIGTERM, then
# stops with the pass in flight finished and exits 0; one database for both moves in place;
# mistakes are one line and exit 2, before any database is opened.
from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import trio

import jobs_trio
from jobs_trio._cli.main import main
from jobs_trio.testing.conformance.helpers import new_job
from tests.helpers.process_helpers import JOBS_TRIO, ROOT, until

pytestmark = pytest.mark.slow


async def relay_process(tmp_path: Path, *args: str) -> tuple[trio.Process, Path]:
    log = tmp_path / f"relay-{len(list(tmp_path.glob('relay-*.log')))}.log"
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [*JOBS_TRIO, "relay", *args], cwd=ROOT, stdin=subprocess.DEVNULL, stderr=stderr
        )
    return process, log


@pytest.mark.parametrize("one_database", [False, True])
async def test_the_relay_command_moves_rows_and_stops_cleanly_on_sigterm(
    tmp_path: Path, one_database: bool
) -> None:
    app_url = f"sqlite:///{tmp_path / 'app.db'}"
    jobs_url = app_url if one_database else f"sqlite:///{tmp_path / 'jobs.db'}"
    async with (
        jobs_trio.open_driver(app_url) as app_db,
        jobs_trio.open_driver(jobs_url) as store,
    ):
        rows = [new_job(payload={"n": n}, key=f"k{n % 3}") for n in range(5)]
        await app_db.outbox_write(rows)
        process, log = await relay_process(tmp_path, app_url, jobs_url, "--poll", "0.05")
        try:

            async def moved() -> bool:
                return (await app_db.outbox_stats()).pending == 0

            await until("the relay to empty the outbox", 30, moved)
            await app_db.outbox_write([new_job(payload={"n": 5})])  # a later commit too
            await until("the relay to move the later row", 30, moved)
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
        text = log.read_text()
        mode = "in-place" if one_database else "two-step"
        assert f"mode={mode}" in text
        for event in ("jobs.relay.started", "jobs.relay.stopping", "jobs.relay.stopped"):
            assert event in text, text
        # Keys as a direct enqueue decides them, in the order written: one job per key k0..k2,
        # and the later unkeyed row.
        jobs = await store.list_jobs(limit=100)
        assert sorted(j.key or "-" for j in jobs) == ["-", "k0", "k1", "k2"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["relay", "memory://", "sqlite:///jobs.db"], "memory:// lives in one process"),
        (["relay", "sqlite:///app.db", "memory://"], "memory:// lives in one process"),
        (["relay", "sqlite:///a.db", "sqlite:///b.db", "--db", "sqlite:///c.db"], "two job"),
        (["relay", "sqlite:///a.db", "sqlite:///b.db", "--app-schema", "s"], "--app-schema"),
        (["relay", "sqlite:///a.db"], "no database URL"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(
    argv: list[str],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JOBS_TRIO_DB", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error [X_CONFIG]") and said in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_a_missing_application_database_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = tmp_path / "app.db"
    assert main(["relay", f"sqlite:///{app}", f"sqlite:///{tmp_path / 'jobs.db'}"]) == 2
    assert "no database" in capsys.readouterr().err
    assert not app.exists()
