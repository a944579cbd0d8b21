# docs/troubleshooting.md quotes the errors a user meets first (issue 36): each quote is checked
# against what the CLI really prints for that mistake, so the page cannot drift from the code.
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers.process_helpers import ROOT
from tests.ops import test_cli as base

Cli = base.Cli
cli = base.cli
db = base.db

PAGE = ROOT / "docs" / "troubleshooting.md"
QUOTE = re.compile(r"^\*\*(\d+)\. `error \[(X_[A-Z_]+)\]: (.+?)`\*\*$", re.M)


def quotes() -> dict[int, tuple[str, str]]:
    return {int(n): (code, text) for n, code, text in QUOTE.findall(PAGE.read_text())}


def same_words(quoted: str, printed: str, *, varying: tuple[str, ...] = ()) -> None:
    """The quote, but for the parts that vary by machine (a path, a host), is what was printed:
    each run of it between those parts is found in order."""
    parts = [quoted]
    for part in varying:
        parts = [piece for chunk in parts for piece in chunk.split(part)]
    position = 0
    for piece in filter(None, (p.strip(" .") for p in parts)):
        found = printed.find(piece, position)
        assert found >= 0, f"{piece!r} is not in what the CLI printed: {printed!r}"
        position = found + len(piece)


def test_the_page_quotes_ten_errors() -> None:
    assert sorted(quotes()) == list(range(1, 11))


def test_each_quote_is_what_the_cli_prints(
    cli: Cli, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quoted = quotes()
    monkeypatch.chdir(tmp_path)

    def check(number: int, *argv: str, varying: tuple[str, ...] = ()) -> None:
        code, text = quoted[number]
        printed = cli.fails(*argv, code=code)
        same_words(text, printed, varying=varying)

    check(1, "list")
    check(2, "list", "--db", "sqlite:///jobs.db")
    check(5, "list", "--db", "postgresql://app:secret@[::1/db")
    check(8, "worker", "myapp.jobs", "--db", db)
    check(10, "worker")
    with monkeypatch.context() as missing:
        missing.setitem(sys.modules, "asyncpg", None)
        missing.setitem(sys.modules, "trio_asyncio", None)
        check(3, "list", "--db", "postgresql://u@h/db")


@pytest.mark.postgres
def test_each_postgresql_quote_is_what_the_cli_prints(cli: Cli, postgres_url: str) -> None:
    quoted = quotes()
    code, text = quoted[4]
    printed = cli.fails("list", "--db", postgres_url, "--schema", "jobs_trio_never", code=code)
    same_words(text, printed, varying=("'jobs_trio'",))
    code, text = quoted[6]
    joiner = "&" if "?" in postgres_url else "?"
    printed = cli.fails("list", "--db", f"{postgres_url}{joiner}connect_timeout=10", code=code)
    same_words(text, printed, varying=("db:5432",))
    code, text = quoted[7]
    printed = cli.fails("list", "--db", "postgresql://u@127.0.0.1:1/db", code=code)
    same_words(text, printed, varying=("db:5432", "..."))
