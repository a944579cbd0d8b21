# A real PgBouncer (Debian's package) in front of a PostgreSQL server, started and ended here:
# what tests/drivers/test_pgbouncer_processes.py and the fault matrix (tests/faults/) put between
# their
# workers and the server. Apart because both start it the same way.
from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlparse

import trio

from tests.helpers.process_helpers import free_port

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)
MISSING = "no pgbouncer binary (apt-get install pgbouncer, or .ci/install-pgbouncer)"


@asynccontextmanager
async def open_pgbouncer(folder: Path, server: str, mode: str) -> AsyncIterator[str]:
    """A PgBouncer in ``mode`` in front of ``server``, its files in ``folder`` (made here);
    answers the host:port to connect to. Its process is ours: terminated and waited for on the
    way out. Raises RuntimeError (MISSING) where no binary is installed."""
    if PGBOUNCER is None:
        raise RuntimeError(MISSING)
    target = urlparse(server)
    user = target.username or "postgres"
    port = free_port()
    folder.mkdir()
    (folder / "users.txt").write_text(f'"{user}" "{target.password or ""}"\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target.hostname or '127.0.0.1'} port={target.port or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {folder / 'users.txt'}\n"
        f"pool_mode = {mode}\nmax_client_conn = 200\n"
        # Session mode holds a server connection per client connection (a worker: up to
        # pool_size + 1); transaction mode shares a few between every client.
        f"default_pool_size = {60 if mode == 'session' else 4}\n"
    )
    # PgBouncer refuses to run as root; it reads its files before it drops to the user.
    command = [
        PGBOUNCER,
        *(["-u", "postgres"] if os.geteuid() == 0 else []),
        str(folder / "pgbouncer.ini"),
    ]
    log_path = folder / "pgbouncer.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(command, stdin=subprocess.DEVNULL, stderr=log)
    try:
        with trio.fail_after(10):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"pgbouncer exited: {log_path.read_text()}")
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                except OSError:
                    await trio.sleep(0.1)
                    continue
                await stream.aclose()
                break
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        with trio.CancelScope(shield=True):
            await process.wait()


def through(url: str, bouncer: str, query: str) -> str:
    """``url`` with its host:port replaced by ``bouncer`` and its query by ``query``."""
    parsed = urlparse(url)
    login = parsed.netloc.rpartition("@")[0]
    return parsed._replace(netloc=f"{login}@{bouncer}" if login else bouncer, query=query).geturl()
