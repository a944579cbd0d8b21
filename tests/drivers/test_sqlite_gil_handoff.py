# The SQLite door's thread gets the GIL while the Trio loop has work (_gil_handoff.py), and the
# claim's one-step look brings back every column as the table holds it. Apart from
# test_sqlite_driver.py because these are about the door's turns at the GIL and its JSON.
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import trio

from jobs_trio.drivers import _gil_handoff
from jobs_trio.drivers._gil_handoff import GilHandoff
from jobs_trio.drivers.sqlite import open_sqlite_driver
from jobs_trio.drivers.sqlite._jobs import INLINE_PAYLOAD
from jobs_trio.testing.conformance.helpers import new_job

# What the loop may do while three enqueues run beside it: a lend at each of its passes lets
# each statement go at the next pass (measured here: ~1 ms an enqueue, a few hundred spins).
# Without it the door's thread waited for a loop that never idles: 0.7-2.0 s an enqueue, over
# 100,000 spins each. The spinners give up at GIVE_UP, so that the test ends either way.
SPINS_ALLOWED = 20_000
GIVE_UP = 400_000


async def test_an_enqueue_beside_a_loop_that_never_idles_is_not_kept_waiting(
    tmp_path: Path,
) -> None:
    async with open_sqlite_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as driver:
        await driver.enqueue([new_job()])  # the file made and its statements prepared
        spins = 0
        done = False

        async def spin() -> None:
            # A busy application: always a task to run, so the loop never waits for I/O
            # (where CPython would hand the GIL over anyway).
            nonlocal spins
            while not done and spins < GIVE_UP:
                for _ in range(300):
                    pass
                spins += 1
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(spin)
            await trio.lowlevel.checkpoint()
            for _ in range(3):
                await driver.enqueue([new_job()])
            done = True
        assert spins < SPINS_ALLOWED, f"three enqueues took {spins:,} spins of the loop"


async def test_the_loop_lends_the_gil_only_while_a_call_is_in_flight(tmp_path: Path) -> None:
    async with open_sqlite_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as driver:
        handoff = driver._door._handoff
        in_flight = trio.Event()
        release = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def work(conn: sqlite3.Connection, now: float) -> None:
            token.run_sync_soon(in_flight.set)
            trio.from_thread.run(release.wait, trio_token=token)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver._door.transact, work)
            await in_flight.wait()
            try:
                # Installed now: removing it works (and it goes back, for the call's exit).
                trio.lowlevel.remove_instrument(handoff)
                trio.lowlevel.add_instrument(handoff)
            finally:
                release.set()  # else a failure here would leave the call waiting for good
        with pytest.raises(KeyError):
            trio.lowlevel.remove_instrument(handoff)


async def test_a_claim_brings_long_payloads_and_run_ats_as_stored(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    long = {"text": "é\x00\u2028" + "x" * INLINE_PAYLOAD}  # past the look's inline limit
    async with open_sqlite_driver(f"sqlite:///{path}") as driver:
        jobs = [new_job(payload={"n": 0}), new_job(payload=long), new_job(payload={"n": 2})]
        await driver.enqueue(jobs)
        with sqlite3.connect(path) as conn:
            # A run-at whose 16th and 17th digits matter: SQLite's JSON writes a REAL with 15.
            conn.execute("UPDATE jobs SET run_at = run_at - 1000.000000123456789")
            stored = dict(conn.execute("SELECT id, run_at FROM jobs").fetchall())
        conn.close()
        claims = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    payloads = {j.job_id: json.loads(j.payload) for j in jobs}
    assert sorted(c.job_id for c in claims) == sorted(payloads)
    for claim in claims:
        assert json.loads(claim.payload) == payloads[claim.job_id]
        assert claim.due_at == stored[claim.job_id]  # to the last bit


class _Clocks:
    """The loop's clock and the door thread's CPU clock, moved by hand."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def perf_counter(self) -> float:
        return self.wall

    def clock_gettime(self, clock: int) -> float:
        return self.cpu

    def pthread_getcpuclockid(self, ident: int) -> int:
        return 1


def _opened(monkeypatch: pytest.MonkeyPatch) -> tuple[GilHandoff, _Clocks]:
    """A handoff on clocks moved by hand, as its thread leaves it just before a statement: its
    clock known, the gate open."""
    clocks = _Clocks()
    monkeypatch.setattr(_gil_handoff, "time", clocks)
    handoff = GilHandoff()
    handoff.opening()
    return handoff, clocks


def test_a_pass_lends_the_gil_only_to_a_thread_that_stood_still(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handoff, clocks = _opened(monkeypatch)
    clocks.wall += 0.001
    clocks.cpu += 0.001  # it ran all along (inside the statement)
    handoff.before_io_wait(0)
    assert not handoff._gate.locked(), "a pass waited on a thread that needed no GIL"
    handoff.before_io_wait(0.5)  # a loop with nothing to run lends at its I/O wait anyway
    assert not handoff._gate.locked()
    clocks.wall += 0.001  # its clock stood still: it waits for the GIL
    handoff.before_io_wait(0)
    assert handoff._gate.locked(), "the pass did not lend the GIL to a waiting thread"


def test_a_thread_that_did_not_run_while_lent_the_gil_is_lent_it_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It waits for its disk (a COMMIT's fsync): each lend meanwhile would cost the loop LEND.
    handoff, clocks = _opened(monkeypatch)
    handoff._gate.acquire()  # inside its statement
    clocks.wall += 0.001
    handoff.before_io_wait(0)  # lends, in vain: the gate stays shut, its clock stands still
    handoff._gate.release()  # its next statement
    clocks.wall += 0.001
    handoff.before_io_wait(0)
    assert not handoff._gate.locked(), "the pass lent again at once"
    clocks.wall += 0.001
    handoff.before_io_wait(0)
    assert handoff._gate.locked(), "the pass after it did not lend"
