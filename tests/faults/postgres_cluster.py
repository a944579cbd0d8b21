# A private PostgreSQL cluster for the fault matrix: its own data directory and port, so the
# matrix may stop, restart and reconfigure it without touching the shared server that other
# test runs use. Apart because every PostgreSQL cell stands on it and its removal must not fail.
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from tests.helpers.process_helpers import free_port


class Unavailable(Exception):
    """What a cell needs is not on this machine; the message says what and how to get it."""


def postgres_bin() -> Path:
    """The newest installed server's bin folder (Debian keeps one per major version)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name)
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    raise Unavailable("no PostgreSQL server binaries (apt-get install postgresql)")


def _as_postgres() -> list[str]:
    # The server refuses to run as root: run its binaries as the `postgres` user when we are.
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


@attrs.frozen
class Cluster:
    folder: Path  # the data directory is folder/data; the socket and the server log beside it
    port: int
    bin: Path

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    async def ctl(self, *args: str) -> None:
        # fsync off: the cells crash the server, never the machine, and this one is shared.
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        command = [
            *_as_postgres(),
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.folder / "data"),
            "-l",
            str(self.folder / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            *args,
        ]
        await trio.run_process(command, capture_stdout=True, capture_stderr=True)

    async def sql(self, statement: str, database: str = "postgres") -> str:
        """One statement through psql as the superuser; answers its unaligned output."""
        done = await trio.run_process(
            [
                str(self.bin / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-c",
                statement,
            ],
            capture_stdout=True,
            capture_stderr=True,
            env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
        )
        return str(done.stdout.decode().strip())

    async def new_database(self, owner: str = "postgres") -> str:
        name = f"jt_{uuid.uuid4().hex[:12]}"
        await self.sql(f'CREATE DATABASE "{name}" OWNER "{owner}"')
        return name


@asynccontextmanager
async def private_cluster(log_to: Path) -> AsyncIterator[Cluster]:
    """A new cluster on a free port, trusting local connections; stopped (immediately) and its
    folder deleted on the way out, whatever happened, its server log kept at ``log_to``."""
    bin_folder = postgres_bin()
    folder = Path(tempfile.mkdtemp(prefix="jobs-trio-faults-pg-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        cluster = Cluster(folder=folder, port=free_port(), bin=bin_folder)
        initdb: Sequence[str] = [
            *_as_postgres(),
            str(bin_folder / "initdb"),
            "-D",
            str(folder / "data"),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]
        await trio.run_process(initdb, capture_stdout=True, capture_stderr=True)
        await cluster.ctl("start")
        try:
            yield cluster
        finally:
            # Already stopped is fine (a cell that stopped it, then failed).
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(60),
                contextlib.suppress(subprocess.CalledProcessError),
            ):
                await cluster.ctl("stop", "-m", "immediate")
    finally:
        with contextlib.suppress(OSError):
            shutil.copyfile(folder / "server.log", log_to)
        shutil.rmtree(folder, ignore_errors=True)
