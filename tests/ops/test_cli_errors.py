# The mistakes an operator makes first, each answered with what to do (issue 36): a missing
# extra, a URL that does not parse, a URL setting the server does not know, a port already
# taken. Before, each reached the user as X_UNEXPECTED, "a bug in jobs_trio", or with a fix
# ("retry ... run jobs-trio migrate") that could not help.
from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import pytest

import jobs_trio
from tests.ops import test_cli as base

Cli = base.Cli
cli = base.cli
db = base.db
enqueue = base.enqueue


def test_version_is_the_package_version(cli: Cli) -> None:
    out = cli.ok("--version")
    assert out == f"jobs-trio {jobs_trio.__version__}\n"
    assert jobs_trio.__version__.count(".") == 2


def test_a_missing_postgres_extra_says_which_extra_to_install(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if `pip install jobs-trio` had been run without [postgres]: the modules cannot import.
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    monkeypatch.setitem(sys.modules, "trio_asyncio", None)
    for argv in (["list"], ["migrate"]):
        err = cli.fails(*argv, "--db", "postgresql://u@127.0.0.1/db", code="X_CONFIG")
        assert "need packages that are not installed (asyncpg, trio_asyncio)" in err
        assert "fix: pip install 'jobs-trio[postgres]'" in err


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("postgresql://u:secret@[::1/x", "Invalid IPv6 URL"),
        ("postgresql://u:secret@host:99999/x", "Port out of range"),
        ("postgresql://u:secret@host:five/x", "Port could not be cast"),
    ],
)
def test_a_malformed_url_is_the_users_to_fix_not_a_bug(cli: Cli, url: str, problem: str) -> None:
    err = cli.fails("list", "--db", url, code="X_CONFIG")
    assert "is malformed" in err and problem in err
    assert "secret" not in err  # masked, as every echo of a URL is
    assert "brackets ([::1])" in err


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("connect_timeout=abc", '"connect_timeout"'),
        ("bogus=1", '"bogus"'),
        ("work_mem=lots", '"work_mem"'),
    ],
)
def test_a_url_setting_the_server_refuses_names_the_parameter(
    cli: Cli, postgres_url: str, query: str, named: str
) -> None:
    joiner = "&" if "?" in postgres_url else "?"
    err = cli.fails("list", "--db", f"{postgres_url}{joiner}{query}", code="X_CONFIG")
    assert "refused a setting the URL passes" in err and named in err
    assert "remove or correct that ?NAME=VALUE" in err
    assert "migrate" not in err and "retry" not in err


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_dashboard_port_in_use_says_to_pick_another(cli: Cli, db: str, taken_port: int) -> None:
    enqueue(cli, db, "mail.send")
    err = cli.fails("dashboard", "--db", db, "--port", str(taken_port), code="X_CONFIG")
    assert f"the dashboard cannot listen on 127.0.0.1:{taken_port}" in err
    assert "pick another port (--port N; 0 picks a free one)" in err


def test_a_metrics_port_in_use_says_to_pick_another(cli: Cli, db: str, taken_port: int) -> None:
    err = cli.fails(
        "worker",
        "tests.apps.cli_app",
        "--db",
        db,
        "--metrics-port",
        str(taken_port),
        "--log-level",
        "error",  # the worker's own lines (it starts before the endpoint) stay out of stderr
        code="X_CONFIG",
    )
    assert f"the /metrics endpoint cannot listen on 127.0.0.1:{taken_port}" in err
    assert "--metrics-port N" in err


def test_a_metrics_host_not_of_this_machine_is_refused_before_any_job_runs(
    cli: Cli, db: str
) -> None:
    job_id = enqueue(cli, db, "app.hello", "--app", "tests.apps.cli_app")
    err = cli.fails(
        "worker",
        "tests.apps.cli_app",
        "--db",
        db,
        "--metrics-port",
        "0",
        "--metrics-host",
        "203.0.113.1",  # TEST-NET-3: no machine's own address
        code="X_CONFIG",
    )
    assert "the /metrics endpoint cannot listen on 203.0.113.1:0" in err
    assert "give --metrics-host an address of this machine" in err
    assert "jobs.worker.started" not in err  # refused before the worker claimed anything
    shown = cli.ok("show", job_id, "--json", "--db", db)
    assert '"state": "ready"' in shown and '"attempts": 0' in shown
