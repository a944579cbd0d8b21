# Real `jobs-trio worker` processes through a real PgBouncer (Debian's package, started here),
# in each supported mode (issue 20): jobs enqueued, claimed, a running job drained on SIGTERM,
# and every job completed exactly once. Skipped where no `pgbouncer` binary is installed.
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest
import trio

from jobs_trio.errors import ConfigError
from jobs_trio.open_driver import open_driver
from tests.apps.postgres_app import registry
from tests.process_helpers import assert_drained, started, until
from tests.test_processes_postgres import (
    assert_each_ran_once,
    body_started,
    completed_by_the_second,
    completed_in,
    fresh_database,
    stop,
    workers,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def a_pgbouncer(tmp_path: Path, server: str, mode: str) -> AsyncIterator[str]:
    """A PgBouncer in ``mode`` in front of ``server``; answers the host:port to connect to.
    Its process is ours: terminated and waited for on the way out."""
    if PGBOUNCER is None:
        why = "no pgbouncer binary (apt-get install pgbouncer, or .ci/install-pgbouncer)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    target = urlparse(server)
    user = target.username or "postgres"
    port = free_port()
    folder = tmp_path / f"pgbouncer-{mode}"
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
    with (folder / "pgbouncer.log").open("wb") as log:
        process = await trio.lowlevel.open_process(command, stdin=subprocess.DEVNULL, stderr=log)
    try:

        async def accepting() -> bool:
            if process.returncode is not None:
                pytest.fail(f"pgbouncer exited: {(folder / 'pgbouncer.log').read_text()}")
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                return False
            await stream.aclose()
            return True

        await until("pgbouncer to accept connections", 10, accepting)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        with trio.CancelScope(shield=True):
            await process.wait()


def through(url: str, bouncer: str, query: str) -> str:
    parsed = urlparse(url)
    login = parsed.netloc.rpartition("@")[0]
    return parsed._replace(netloc=f"{login}@{bouncer}" if login else bouncer, query=query).geturl()


MODES = {
    "session": "pgbouncer=session",
    "transaction, LISTEN direct": "pgbouncer=transaction&listen_port={direct_port}",
    "transaction, polling": "pgbouncer=transaction",
}


@pytest.mark.parametrize("mode", MODES)
async def test_workers_through_pgbouncer_run_each_job_once_and_drain(
    tmp_path: Path, postgres_url: str, mode: str
) -> None:
    seen = tmp_path / "seen.txt"
    pool_mode = mode.split(",")[0]
    query = MODES[mode].format(direct_port=urlparse(postgres_url).port or 5432)
    async with (
        fresh_database(postgres_url) as direct,
        a_pgbouncer(tmp_path, postgres_url, pool_mode) as bouncer,
    ):
        url = through(direct, bouncer, query)
        async with open_driver(url) as driver:
            hang_id = await registry.require("app.hang").enqueue(driver, {"seconds": 60})
            async with workers(tmp_path, url, 2, "--concurrency", "20") as procs:
                await started(procs)
                # Enqueued after the workers wait: they are woken (or poll) through the pooler.
                ids = await registry.require("app.record").enqueue_many(
                    driver, [{"seen": str(seen)}] * 500
                )

                async def all_completed() -> bool:
                    return await completed_in(driver, "bulk") == len(ids)

                await until("500 jobs completed through pgbouncer", 60, all_completed)
                await body_started(driver, hang_id)
                # Either may hold the hang job: both are drained, and each must exit 0.
                for proc in procs:
                    proc.signal(signal.SIGTERM)
                for proc in procs:
                    assert await proc.exit_code(within=15) == 0, proc.output()
            [holder] = [p for p in procs if "jobs.attempt.interrupted" in p.output()]
            await assert_drained(driver, hang_id, holder)
            async with workers(tmp_path, url, 1) as [second]:
                await completed_by_the_second(driver, hang_id)
                await stop([second])
    assert_each_ran_once(seen, ids)


async def test_a_direct_connect_through_pgbouncer_says_to_name_the_mode(
    tmp_path: Path, postgres_url: str
) -> None:
    async with a_pgbouncer(tmp_path, postgres_url, "session") as bouncer:
        with pytest.raises(ConfigError) as refused:
            async with open_driver(through(postgres_url, bouncer, "")):
                pass
    assert "?pgbouncer=session" in refused.value.fix
