# The PostgreSQL driver's SQL: named statements from postgres_queries.sql and the numbered
# migrations, with a checked schema name filled in. Apart because this is the one place a
# string becomes SQL, and the schema name is checked here before it ever does.
# Internal: not part of the public API (docs/reference.md lists the public modules).
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from importlib import resources

import attrs

from ..errors import ConfigError
from .migration_files import Migration, read_migrations
from .rules import JOB_COLUMNS, LIVE_STATES_SQL, SETTLEMENT_KINDS

# Matched with fullmatch: `$` also matches before a trailing newline, and "jobs\n" must not
# pass for a plain identifier.
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# One statement per kind of settlement, each the `settle` frame with the kind's own pieces.
SETTLE_KINDS = tuple(kind.name for kind in SETTLEMENT_KINDS.values())

_NAME_LINE = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def check_schema_name(schema: object) -> str:
    """``schema`` if it is a plain lower-case identifier; a ConfigError otherwise."""
    if not isinstance(schema, str) or not SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(
            f"schema name {schema!r} is not a plain identifier",
            fix="use lower-case letters, digits and underscores, starting with a letter or "
            "underscore, at most 63 characters (e.g. schema='jobs_trio')",
        )
    if schema.startswith("pg_"):
        raise ConfigError(
            f"schema name {schema!r} starts with pg_, which PostgreSQL reserves for itself",
            fix="pick a name without the pg_ prefix (e.g. schema='jobs_trio')",
        )
    return schema


@attrs.frozen
class Statements:
    """The statements for one schema, looked up by the names in postgres_queries.sql."""

    schema: str
    by_name: Mapping[str, str]
    migrations: Sequence[Migration]

    def __getitem__(self, name: str) -> str:
        return self.by_name[name]

    @property
    def channel(self) -> str:
        """The NOTIFY channel: the schema's own name, so two schemas on one server (two apps,
        or two test runs) never wake each other's workers."""
        return self.schema

    @property
    def newest_version(self) -> int:
        return self.migrations[-1].version if self.migrations else 0

    @property
    def migrations_table(self) -> str:
        """For to_regclass(): the qualified name as text."""
        return f'"{self.schema}".migrations'

    @property
    def migration_lock_key(self) -> int:
        """A stable 64-bit advisory lock key per schema (the lock space is server-wide)."""
        digest = hashlib.blake2b(f"jobs_trio.migrate:{self.schema}".encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "big", signed=True)


def load_statements(schema: str) -> Statements:
    schema = check_schema_name(schema)
    # Quoted even though checked: a valid name may still be a keyword ("user", "order").
    fill = {
        "{schema}": f'"{schema}"',
        "{job_columns}": JOB_COLUMNS,
        "{live_states}": LIVE_STATES_SQL,
    }
    folder = resources.files("jobs_trio.drivers")
    text = (folder / "postgres_queries.sql").read_text(encoding="utf-8")
    by_name = {name: _fill(sql, fill) for name, sql in _split_named(text).items()}
    for kind in SETTLE_KINDS:
        by_name[f"settle_{kind}"] = _fill(
            by_name["settle"],
            {
                "{kind_rows}": by_name.pop(f"settle_{kind}_rows"),
                "{kind_set}": _strip_comments(by_name.pop(f"settle_{kind}_set")),
            },
        )
    return Statements(
        schema=schema,
        by_name=by_name,
        migrations=[
            attrs.evolve(m, sql=_fill(m.sql, fill)) for m in read_migrations("postgres_migrations")
        ],
    )


def _fill(sql: str, fill: Mapping[str, str]) -> str:
    for placeholder, value in fill.items():
        sql = sql.replace(placeholder, value)
    return sql


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))


def _split_named(text: str) -> dict[str, str]:
    parts = _NAME_LINE.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    named: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in named:
            raise RuntimeError(f"postgres_queries.sql names {name!r} twice")
        named[name] = body.strip().rstrip(";").strip()
    return named
