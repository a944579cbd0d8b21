# Whether this release can use a schema: the migrations it needs are applied, and the schema's
# compatibility level is one it works with, whatever a newer release added beside them. Apart
# because SQLite and PostgreSQL judge with one rule, the rule that lets the previous release
# keep starting (and a rollback land) against the next release's schema.
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

from .._core.errors import SchemaVersionError
from .._core.logs import log_event
from .._core.version import VERSION
from ._migration_files import COMPATIBILITY_LEVEL, Migration

# 0.1 checks a schema strictly, and that check cannot change: it refuses any migration it does
# not know (PostgreSQL: a version past 0010 in the `migrations` table; SQLite: a user_version
# past 9). So from 0.2 on the full record is the `schema_history` table, and what 0.1 reads is
# kept as 0.1 wrote it while the schema stays at level 1 (0.1 starts against it), then set past
# its newest migration, to MARK_FOR_0_1 + level, once a migration raises the level (0.1
# refuses it, as it must). Never a migration number: those have four digits.
MARK_FOR_0_1: Final = 10_000

DOCS: Final = "docs/howto-deploy.md, 'Upgrades and rollbacks'"


@attrs.frozen
class Applied:
    """One applied migration as the database records it."""

    version: int
    # The schema's level once it was applied. None: recorded where no level is kept (0.1's
    # record) by a release this one does not know, which cannot be judged.
    level: int | None
    name: str = ""
    applied_by: str = ""  # the release that applied it; "" when 0.1 (or a build before) did
    applied_at: float | None = None

    def described(self) -> str:
        by = f"jobs_trio {self.applied_by}" if self.applied_by else "a release before 0.2"
        return f"migration {self.version} ({self.name or 'unnamed'}, applied by {by})"


@attrs.frozen
class Verdict:
    """What one look at a schema found, for a release knowing ``known``."""

    missing: tuple[Migration, ...]  # this release's migrations not applied yet
    unknown: tuple[Applied, ...]  # applied, and not this release's: a newer release's
    level: int  # the schema's compatibility level
    # The first applied migration that took the level past what this release works with.
    breaking: Applied | None


def judge(
    known: Sequence[Migration],
    applied: Iterable[Applied],
    *,
    works_with: int = COMPATIBILITY_LEVEL,
) -> Verdict:
    recorded = {m.version: m for m in applied}
    versions = {m.version for m in known}
    levels = [m.level for m in recorded.values() if m.level is not None]
    breaking = next(
        (m for _, m in sorted(recorded.items()) if m.level is not None and m.level > works_with),
        None,
    )
    return Verdict(
        missing=tuple(m for m in known if m.version not in recorded),
        unknown=tuple(m for v, m in sorted(recorded.items()) if v not in versions),
        level=max(levels, default=1),
        breaking=breaking,
    )


def level_after(level: int, migration: Migration) -> int:
    """The schema's level once ``migration`` is applied to a schema at ``level``."""
    return max(level, migration.level or 1)


def mark_for_0_1(level: int, newest_in_0_1: int) -> int:
    """What 0.1's record says of a schema at ``level``: its own newest migration while it can
    use the schema, a number past every migration (which it refuses) once it cannot."""
    return newest_in_0_1 if level <= 1 else MARK_FOR_0_1 + level


def refuse_incompatible(
    verdict: Verdict, where: str, *, works_with: int = COMPATIBILITY_LEVEL
) -> None:
    """A schema this release must not touch: a newer release made a change it cannot use, or
    recorded a migration with no level to judge it by."""
    if verdict.breaking is not None:
        breaking = verdict.breaking
        newer = f"jobs_trio {breaking.applied_by}" if breaking.applied_by else "the newer release"
        raise SchemaVersionError(
            f"{where} is at compatibility level {verdict.level}: {breaking.described()} changed"
            f" it in a way jobs_trio {VERSION} cannot work with (it works with level"
            f" {works_with} at most)",
            fix=f"run {newer} or a later release here. To go back to {VERSION}, restore the"
            f" database from a backup taken before migration {breaking.version}; a release"
            f" that can still use the schema (one working with level {verdict.level}) is the"
            f" other way back ({DOCS})",
        )
    unjudged = [m.version for m in verdict.unknown if m.level is None]
    if unjudged:
        raise SchemaVersionError(
            f"{where} records migrations {unjudged} that jobs_trio {VERSION} does not know,"
            " with no compatibility level to tell whether it can work with them",
            fix="run the jobs_trio release that applied them (or a later one) here; an older"
            " release must not write to a schema it cannot judge",
        )


def note_ahead(verdict: Verdict, where: str) -> None:
    """Say, once per open, that a newer release's additive migrations are in the schema."""
    if not verdict.unknown:
        return
    releases = sorted({m.applied_by for m in verdict.unknown if m.applied_by})
    log_event(
        "jobs.schema.ahead",
        logging.INFO,
        where=where,
        migrations=",".join(str(m.version) for m in verdict.unknown),
        by=",".join(releases) or "unknown",
        compatibility_level=verdict.level,
        why=f"a newer release migrated {where}; its migrations keep the compatibility level"
        f" ({verdict.level}) jobs_trio {VERSION} works with, so it runs against them and"
        " leaves what they added alone",
    )
