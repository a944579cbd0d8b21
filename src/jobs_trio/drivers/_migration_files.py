# The numbered migration files a driver ships (`0001_name.sql` ...), read from the package in
# version order. Apart so that SQLite and PostgreSQL read and check them with one rule.
from __future__ import annotations

import re
from importlib import resources

import attrs

# Four digits, then a lower-case name: the number is the schema version the file brings.
_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@attrs.frozen
class Migration:
    version: int
    name: str
    sql: str


def read_migrations(folder: str) -> list[Migration]:
    """The migrations in ``jobs_trio/drivers/<folder>``, lowest version first.

    Numbered from 1, each number once. A gap is allowed (branches number their migrations
    apart and meet later; each version is applied on its own), a repeat never: it would say two
    schemas are one version. A ``.sql`` file not named like a migration is refused rather than
    skipped: a migration that silently never runs is a schema that differs from its version.
    """
    found = []
    for entry in (resources.files("jobs_trio.drivers") / folder).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        matched = _MIGRATION_FILE.match(entry.name)
        if matched is None:
            raise RuntimeError(f"{folder}/{entry.name} is not named like 0001_name.sql")
        found.append(
            Migration(int(matched.group(1)), entry.name, entry.read_text(encoding="utf-8"))
        )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if not versions or versions[0] != 1 or len(set(versions)) != len(versions):
        raise RuntimeError(f"{folder} must be numbered 1, 2, 3..., each once; found {versions}")
    return found
