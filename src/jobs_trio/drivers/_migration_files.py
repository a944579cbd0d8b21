# The numbered migration files a driver ships (`0001_name.sql` ...), read from the package in
# version order, each with the compatibility level it declares. Apart so that SQLite and
# PostgreSQL read and check them with one rule (the convention: the folders' README.md).
from __future__ import annotations

import re
from importlib import resources
from typing import Final

import attrs

# Four digits, then a lower-case name: the number is the schema version the file brings.
_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

# The highest compatibility level of a schema this release works with. A migration the previous
# release can ignore (a new table, a new nullable or defaulted column, a new index) declares
# nothing and leaves a schema's level as it was, so that release keeps starting against it. A
# migration it cannot ignore (a dropped or renamed column, a new NOT NULL column without a
# default, a new meaning for a stored value) raises the level in a line of its own,
# `-- compatibility-level: 2`, and every release that works with less refuses the schema from
# then on. Raise this constant in the release whose code stops needing what a later migration
# will remove (expand, then contract a release later): that release keeps working after it.
COMPATIBILITY_LEVEL: Final = 1

_LEVEL_LINE = re.compile(r"^--\s*compatibility-level:\s*(\S+)\s*$", re.MULTILINE)
# A migration applied statement by statement, outside any transaction: PostgreSQL's CREATE INDEX
# CONCURRENTLY cannot run inside one (_postgres_index_builds.py says what such a file may hold).
_NO_TRANSACTION_LINE = re.compile(r"^--\s*transaction:\s*none\s*$", re.MULTILINE)


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: str
    # The compatibility level a schema is at once this is applied; None: additive, the schema
    # keeps the level it had.
    level: int | None = None
    # False: `-- transaction: none`, each statement on its own (an index built CONCURRENTLY, so
    # that the fleet's writes never wait for the build); re-run whole after an interruption.
    transaction: bool = True


def declared_level(name: str, sql: str) -> int | None:
    """The level a migration's ``-- compatibility-level: N`` line declares, None without one."""
    found = _LEVEL_LINE.findall(sql)
    if not found:
        return None
    if len(found) > 1 or not found[0].isdigit() or int(found[0]) < 2:
        raise RuntimeError(
            f"{name} declares its compatibility level as {found}: write one line"
            " `-- compatibility-level: N`, N a whole number from 2 (level 1 is every schema's"
            " first; an additive migration declares nothing)"
        )
    return int(found[0])


def read_migrations(folder: str, *, works_with: int = COMPATIBILITY_LEVEL) -> list[Migration]:
    """The migrations in ``jobs_trio/drivers/<folder>``, lowest version first.

    Numbered from 1, each number once. A gap is allowed (branches number their migrations
    apart and meet later; each version is applied on its own), a repeat never: it would say two
    schemas are one version. A ``.sql`` file not named like a migration is refused rather than
    skipped: a migration that silently never runs is a schema that differs from its version.
    A migration declaring a level past ``works_with`` is refused too: the release shipping it
    would refuse its own schema.
    """
    found = []
    for entry in (resources.files("jobs_trio.drivers") / folder).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        matched = _MIGRATION_FILE.match(entry.name)
        if matched is None:
            raise RuntimeError(f"{folder}/{entry.name} is not named like 0001_name.sql")
        sql = entry.read_text(encoding="utf-8")
        level = declared_level(entry.name, sql)
        if level is not None and level > works_with:
            raise RuntimeError(
                f"{folder}/{entry.name} raises the compatibility level to {level}, past the"
                f" {works_with} this release works with: raise COMPATIBILITY_LEVEL with it"
            )
        transaction = _NO_TRANSACTION_LINE.search(sql) is None
        found.append(Migration(int(matched.group(1)), entry.name, sql, level, transaction))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if not versions or versions[0] != 1 or len(set(versions)) != len(versions):
        raise RuntimeError(f"{folder} must be numbered 1, 2, 3..., each once; found {versions}")
    return found
