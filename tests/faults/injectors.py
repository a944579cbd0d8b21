# The faults the matrix injects into a running fleet, each an async function of the cell's
# scene that returns when its fault is over: a server restarted or stopped, backends killed,
# workers killed or signalled and replaced, a role limited, SQLite's lock held or its disk full.
from __future__ import annotations

import errno
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from tests.faults.fleet import Fleet
from tests.faults.stores import Store


@attrs.frozen
class Scale:
    jobs: int  # enqueued per cell: many short ones, a tenth long ones
    seconds: float  # the run: jobs fall due across it, the fault lands inside it
    lease: float


@attrs.define
class Scene:
    fleet: Fleet
    store: Store
    scale: Scale
    rng: random.Random
    notes: list[str] = attrs.Factory(list)

    def note(self, text: str) -> None:
        self.notes.append(text)

    @property
    def at(self) -> float:
        """When a one-off fault lands: a third of the way in, with the fleet busy."""
        return 0.35 * self.scale.seconds

    @property
    def outage(self) -> float:
        return 2.5 * self.scale.lease


Fault = Callable[[Scene], Awaitable[None]]


async def nothing(scene: Scene) -> None:
    """No fault from outside (the blocked-loop cells' fault is in a job's body)."""


def restart(mode: str) -> Fault:
    async def restart_the_server(scene: Scene) -> None:
        assert scene.store.cluster is not None
        await trio.sleep(scene.at)
        began = time.monotonic()
        await scene.store.cluster.ctl("restart", "-m", mode)
        scene.note(f"restart -m {mode}: {time.monotonic() - began:.1f} s")

    return restart_the_server


async def stop_then_start(scene: Scene) -> None:
    assert scene.store.cluster is not None
    await trio.sleep(scene.at)
    began = time.monotonic()
    await scene.store.cluster.ctl("stop", "-m", "fast")
    await trio.sleep(scene.outage)
    await scene.store.cluster.ctl("start")
    scene.note(f"down {time.monotonic() - began:.1f} s")


async def terminate_backends(scene: Scene) -> None:
    """pg_terminate_backend on every jobs_trio connection to the cell's database, every 2 s
    from a fifth of the run to nine tenths of it."""
    cluster, database = scene.store.cluster, scene.store.database
    assert cluster is not None and database is not None
    await trio.sleep(0.2 * scene.scale.seconds)
    killed = rounds = 0
    end = trio.current_time() + 0.7 * scene.scale.seconds
    while trio.current_time() < end:
        answer = await cluster.sql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            f" WHERE datname = '{database}' AND application_name LIKE 'jobs_trio:%'"
        )
        killed += int(answer or 0)
        rounds += 1
        await trio.sleep(2)
    scene.note(f"{killed} backends terminated in {rounds} rounds")


def chaos(signum: int, *, twice: bool = False) -> Fault:
    """Every few seconds a random worker gets ``signum`` (twice, 5 ms apart, with ``twice``),
    and a replacement starts at once."""

    async def chaos_monkey(scene: Scene) -> None:
        every = max(scene.scale.seconds / 5, 1.5)
        await trio.sleep(every / 2)
        hits = 0
        end = trio.current_time() + scene.scale.seconds - every / 2
        while trio.current_time() < end:
            live = scene.fleet.live()
            if live:
                victim = scene.rng.choice(live)
                scene.fleet.signal(victim, signum)
                if twice:
                    await trio.sleep(0.005)
                    scene.fleet.signal(victim, signum)
                hits += 1
                await scene.fleet.add()
            await trio.sleep(every)
        scene.note(f"{hits} x {signal.Signals(signum).name}{' twice' if twice else ''}")

    return chaos_monkey


async def connection_limit(scene: Scene) -> None:
    """The workers' role limited to one connection per worker plus one, and its sessions
    ended so that every worker must log in again under the limit; kept to the end."""
    cluster, role = scene.store.cluster, scene.store.role
    assert cluster is not None and role is not None
    await trio.sleep(scene.at)
    limit = len(scene.fleet.live()) + 1
    await cluster.sql(f'ALTER ROLE "{role}" CONNECTION LIMIT {limit}')
    ended = await cluster.sql(
        f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = '{role}'"
    )
    scene.note(f"limit {limit}, {ended} sessions ended")


async def write_lock(scene: Scene) -> None:
    """SQLite's write lock held by another connection (a backup, a long CLI write) for 2.5
    leases: every worker's write waits, then fails, until it is let go."""
    path = scene.store.sqlite_path
    assert path is not None
    await trio.sleep(scene.at)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            held.set()
            release.wait()
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, hold)
        began = time.monotonic()
        await trio.to_thread.run_sync(held.wait)
        scene.note(f"lock taken after {time.monotonic() - began:.1f} s")
        await trio.sleep(scene.outage)
        release.set()


def _fill(folder: Path) -> int:
    """Write a filler file until the filesystem says it is full; answers the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with (folder / "filler").open("wb", buffering=0) as out:
        while chunk:
            try:
                written += out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2]
    return written


async def disk_full(scene: Scene) -> None:
    """The SQLite file's filesystem filled to the last byte for 2.5 leases, then freed."""
    disk = scene.store.disk
    assert disk is not None
    await trio.sleep(scene.at)
    written = await trio.to_thread.run_sync(_fill, disk)
    scene.note(f"disk filled with {written >> 20} MiB")
    await trio.sleep(scene.outage)
    (disk / "filler").unlink()
