# Where a cell's jobs live: a SQLite file (on a tiny filesystem of its own for the disk-full
# cell), or a fresh database on the private PostgreSQL cluster, reached directly, as a role
# the cell may limit, or through PgBouncer. Apart so each fault sees the store it breaks.
from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from jobs_trio.drivers._open_driver import open_driver
from tests.faults.postgres_cluster import Cluster, Unavailable
from tests.helpers.pgbouncer_process import MISSING, PGBOUNCER, open_pgbouncer, through

# The disk-full cell's filesystem: room for the jobs, the WAL and their growth in a run.
TMPFS_SIZE = "48m"


@attrs.frozen
class Store:
    url: str  # the harness's own way in (direct, as the superuser)
    workers_url: str  # the workers' way in
    sqlite_path: Path | None = None
    cluster: Cluster | None = None
    database: str | None = None
    role: str | None = None  # the workers' own role, where the cell limits it
    disk: Path | None = None  # the tiny filesystem the SQLite file lives on


@asynccontextmanager
async def sqlite_store(folder: Path) -> AsyncIterator[Store]:
    path = folder / "jobs.db"
    yield Store(url=f"sqlite:///{path}", workers_url=f"sqlite:///{path}", sqlite_path=path)


@asynccontextmanager
async def sqlite_on_a_tiny_disk(folder: Path) -> AsyncIterator[Store]:
    """The SQLite file on a tmpfs of its own (unmounted on the way out), so the cell can fill
    it: the only way to have SQLite itself meet a full disk (SQLITE_FULL) here."""
    disk = folder / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        raise Unavailable("mounting a tmpfs for the disk-full cell needs root")
    try:
        await trio.run_process(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(disk)],
            capture_stdout=True,
            capture_stderr=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise Unavailable(f"cannot mount a tmpfs here ({exc})") from exc
    try:
        path = disk / "jobs.db"
        url = f"sqlite:///{path}"
        yield Store(url=url, workers_url=url, sqlite_path=path, disk=disk)
    finally:
        with trio.CancelScope(shield=True):
            # Lazily: a worker killed a moment ago may still hold the file open.
            await trio.run_process(["umount", "-l", str(disk)], check=False)


async def _migrated(url: str) -> None:
    # The schema exists before any worker opens the database (workers do not migrate).
    async with open_driver(url, migrate=True):
        pass


@asynccontextmanager
async def postgres_store(cluster: Cluster) -> AsyncIterator[Store]:
    database = await cluster.new_database()
    url = cluster.url(database)
    await _migrated(url)
    yield Store(url=url, workers_url=url, cluster=cluster, database=database)


@asynccontextmanager
async def postgres_as_a_role(cluster: Cluster) -> AsyncIterator[Store]:
    """The workers log in as a plain role of their own (a superuser ignores connection limits),
    owner of the cell's database and so of its jobs_trio schema."""
    role = f"jt_role_{uuid.uuid4().hex[:8]}"
    await cluster.sql(f'CREATE ROLE "{role}" LOGIN')
    database = await cluster.new_database(owner=role)
    workers_url = cluster.url(database, user=role)
    await _migrated(workers_url)
    yield Store(
        url=cluster.url(database),
        workers_url=workers_url,
        cluster=cluster,
        database=database,
        role=role,
    )


@asynccontextmanager
async def through_pgbouncer(cluster: Cluster, folder: Path, mode: str) -> AsyncIterator[Store]:
    if PGBOUNCER is None:
        raise Unavailable(MISSING)
    async with (
        postgres_store(cluster) as direct,
        open_pgbouncer(folder / f"pgbouncer-{mode}", direct.url, mode) as bouncer,
    ):
        # Transaction mode without a direct LISTEN connection: the workers poll.
        workers_url = through(direct.url, bouncer, f"pgbouncer={mode}")
        yield attrs.evolve(direct, workers_url=workers_url)
