# The PostgreSQL driver's SQL: named statements from postgres/*.sql and the numbered
# migrations, with a checked schema name filled in. Apart because this is the one place a
# string becomes SQL, and the schema name is checked here before it ever does.
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from importlib import resources

import attrs

from .._core.errors import ConfigError
from ._migration_files import Migration, read_migrations
from ._rows import JOB_COLUMNS
from ._rules import (
    ATTEMPT_HISTORY,
    LIVE_STATES_SQL,
    ORPHAN_LIMIT,
    SETTLEMENT_KINDS,
    SUSPECT_AT,
    WAITING_STATES_SQL,
)

# Matched with fullmatch: `$` also matches before a trailing newline, and "jobs\n" must not
# pass for a plain identifier.
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# One statement per kind of settlement, each the `settle` frame with the kind's own pieces.
SETTLE_KINDS = tuple(kind.name for kind in SETTLEMENT_KINDS.values())

_NAME_LINE = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)


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
    """The statements for one schema, looked up by the names in postgres/*.sql."""

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

    def table(self, name: str) -> str:
        """For to_regclass(): a table's qualified name as text."""
        return f'"{self.schema}".{name}'

    @property
    def migration_lock_key(self) -> int:
        """A stable 64-bit advisory lock key per schema (the lock space is server-wide)."""
        return _lock_key(f"jobs_trio.migrate:{self.schema}")

    @property
    def index_build_lock_key(self) -> int:
        """The key an index build CONCURRENTLY holds (_postgres_index_builds): not the
        migration lock, which 0.1 waits for without a bound; a build waits for every older
        transaction, so one of 0.1 queued for the lock it held would wait for it for ever."""
        return _lock_key(f"jobs_trio.index-build:{self.schema}")


def _lock_key(name: str) -> int:
    digest = hashlib.blake2b(name.encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def load_statements(schema: str) -> Statements:
    schema = check_schema_name(schema)
    # Quoted even though checked: a valid name may still be a keyword ("user", "order").
    fill = {
        "{schema}": f'"{schema}"',
        "{job_columns}": JOB_COLUMNS,
        "{live_states}": LIVE_STATES_SQL,
        "{waiting_states}": WAITING_STATES_SQL,
        "{attempt_history}": str(ATTEMPT_HISTORY),
        "{orphan_limit}": str(ORPHAN_LIMIT),
        "{suspect_at}": str(SUSPECT_AT),
    }
    by_name = {name: _fill(sql, fill) for name, sql in _read_named().items()}
    # One insert of new jobs for the producers' enqueue and the relay's: only what makes a row
    # a no-op differs (a live key; or, for the relay, a stored id too).
    enqueue_with = by_name["enqueue"]
    for name in ("enqueue", "enqueue_once"):
        conflict = _strip_comments(by_name.pop(f"{name}_conflict"))
        by_name[name] = _fill(enqueue_with, {"{on_conflict}": conflict})
    # Two claim statements, one with lapsed jobs to hand back and one without, share what they
    # take after those and the first rows of their answer.
    takes = _strip_comments(by_name.pop("claim_takes"))
    answer_takes = {"{claim_answer_takes}": _strip_comments(by_name.pop("claim_answer_takes"))}
    claim_with = _fill(
        by_name["claim"], {"{claim_takes}": _fill(takes, {"{after_lapsed}": _AFTER_LAPSED})}
    )
    claim_answer = _fill(by_name.pop("claim_answer"), answer_takes)
    by_name["claim"] = _fill(f"{claim_with}\n{claim_answer}", {"{not_settling}": ""})
    unrescued_with = _fill(
        by_name["claim_unrescued"], {"{claim_takes}": _fill(takes, {"{after_lapsed}": ""})}
    )
    unrescued_answer = _fill(by_name.pop("claim_unrescued_answer"), answer_takes)
    by_name["claim_unrescued"] = f"{unrescued_with}\n{unrescued_answer}"
    settle_answer = by_name.pop("settle_answer")
    for kind in SETTLE_KINDS:
        kind_rows = by_name.pop(f"settle_{kind}_rows")
        settle_with = _fill(
            by_name["settle"],
            {
                "{kind_rows}": kind_rows,
                "{kind_set}": _strip_comments(by_name.pop(f"settle_{kind}_set")),
                "{note_columns}": _note_columns(kind_rows),
            },
        )
        alone = _fill(settle_with, {"{skip_locked}": " SKIP LOCKED"})
        by_name[f"settle_{kind}"] = f"{alone}\n{settle_answer}"
        waits = _fill(settle_with, {"{skip_locked}": ""})
        by_name[f"settle_wait_{kind}"] = f"{waits}\n{settle_answer}"
        by_name[f"settle_claim_{kind}"] = _settle_then_claim(waits, claim_with, claim_answer)
        by_name[f"settle_claim_unrescued_{kind}"] = _settle_then_claim(
            waits, unrescued_with, unrescued_answer
        )
    del by_name["settle"]
    return Statements(
        schema=schema,
        by_name=by_name,
        migrations=[
            attrs.evolve(m, sql=_fill(m.sql, fill)) for m in read_migrations("postgres_migrations")
        ],
    )


# The columns of a settlement's attempt note (postgres.py's settle_columns appends them last, in
# this order): attempt, outcome, worker id, seconds, traceback.
# Each comes as an array literal (_settle_statements._text_array), cast from text.
NOTE_TYPES = ("text::int[]", "text::text[]", "text::text[]", "text::float8[]", "text::text[]")


def _note_columns(kind_rows: str) -> str:
    """The note's parameters for one kind's statement: numbered after the kind's own last."""
    last = max(int(n) for n in _PARAMETER.findall(kind_rows))
    return ", ".join(f"${last + 1 + i}::{sql_type}" for i, sql_type in enumerate(NOTE_TYPES))


# `claim`'s guard, in claim_takes, that nothing is taken beside a lapsed job it hands back.
_AFTER_LAPSED = " AND NOT EXISTS (SELECT 1 FROM lapsed)"

# The claim's parameters come first in settle_claim_<kind>; the settle's follow them.
CLAIM_PARAMETERS = 14
_PARAMETER = re.compile(r"\$(\d+)")
# Where a claim's CTEs begin (after its comments): they follow the settle's in settle_claim_*.
_FIRST_WITH = re.compile(r"^WITH ", re.MULTILINE)


def _settle_then_claim(settle_with: str, claim_with: str, claim_answer: str) -> str:
    """One statement that settles a batch of one kind and claims (issue 16: one round trip
    where there were two). The claim's parameters as they are ($1 now, shared), the settle's
    $2… after them. One snapshot for both: the settled rows are still `running` in it, so the
    claim's lapsed walk leaves them out by id (the settle's ids), or a lapsed lease being
    settled here could be handed back and settled by one statement at once.
    Nor does the claim see the jobs the settle made due now (a retry or suspension without
    delay, the waiters its freed fleet slots woke): each settled row says how many there were
    (`made_due`), for the driver to claim them after, as settle() then claim() would."""

    def after_the_claims(match: re.Match[str]) -> str:
        n = int(match.group(1))
        return f"${n if n == 1 else n + CLAIM_PARAMETERS - 1}"

    settle_ctes = _PARAMETER.sub(after_the_claims, settle_with)
    settle_ids = f"${3 + CLAIM_PARAMETERS - 1}"
    claim_ctes = _fill(
        _ctes_of(claim_with),
        {"{not_settling}": f"AND NOT (id = ANY({settle_ids}::text::text[]))"},
    )
    # The settled rows are the first branch: the settle's locks (the one wait here, in id
    # order, as a settle alone takes them) are then taken before the claim locks anything.
    # The other way round, the claim could hold a lapsed row of this worker's (SKIP LOCKED)
    # that its renewal waits for, while the settle waits for a row the renewal holds.
    return (
        f"{settle_ctes},\n{claim_ctes},\nclaim_rows AS (\n{claim_answer}\n)\n"
        "SELECT false AS claimed, id, token, NULL AS name, NULL AS queue, NULL AS payload,"
        " NULL AS attempts, NULL AS max_attempts, NULL AS lease_until, NULL AS priority,"
        " NULL AS run_at, NULL AS context, NULL AS ahead, NULL AS alone, NULL AS released,"
        " NULL AS orphans, made_due.n AS made_due\n"
        "FROM settled, (SELECT count(*) FROM notified) AS sent,"
        " (SELECT (SELECT count(*) FROM woken) + (SELECT count(*) FROM settled WHERE ready_now)"
        " AS n) AS made_due\n"
        "UNION ALL\n"
        "SELECT true, id, token, name, queue, payload, attempts, max_attempts, lease_until,"
        " priority, run_at, context, ahead, alone, released, orphans, 0 FROM claim_rows"
    )


def _ctes_of(statement: str) -> str:
    """A claim statement's CTEs without its comments and its WITH: to follow other CTEs."""
    found = _FIRST_WITH.search(statement)
    if found is None:
        raise ValueError("a claim statement begins WITH its CTEs")
    return statement[found.end() :]


def _fill(sql: str, fill: Mapping[str, str]) -> str:
    for placeholder, value in fill.items():
        sql = sql.replace(placeholder, value)
    return sql


def _strip_comments(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))


def _read_named() -> dict[str, str]:
    """Every statement of the driver's capabilities, by name: each capability's statements
    stand in a file beside its room (postgres/_jobs.sql beside postgres/_jobs.py, ...).
    In them `{schema}` is the driver's schema (a checked identifier, quoted), `{job_columns}`
    the columns of a JobRecord (never the token), `{live_states}` the states whose job holds
    its unique key (rules.LIVE_STATES, as an SQL list), `{waiting_states}` the states of a job
    waiting to be claimed (records.WAITING_STATES); `$1` is the driver clock's now wherever a
    statement needs the time."""
    named: dict[str, str] = {}
    folder = resources.files("jobs_trio.drivers.postgres")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _NAME_LINE.split(entry.read_text(encoding="utf-8"))
        # parts: [the file's opening comment, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in named:
                raise RuntimeError(f"postgres/*.sql name {name!r} twice ({entry.name})")
            named[name] = body.strip().rstrip(";").strip()
    return named
