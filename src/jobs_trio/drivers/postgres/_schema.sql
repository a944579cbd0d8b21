-- The schema's statements (_postgres_migrate.py, _postgres_index_builds.py, _postgres_locks.py):
-- migrations, their locks, index builds. Placeholders and the loading: _postgres_sql.py.

-- name: migration_waits
-- For the migrating transaction only (is_local): no statement timeout (an index built over a
-- deep table takes what it takes), and the short lock timeout every lock of the migration waits
-- under ($1: '500ms'): a migration that queues for its exclusive lock behind a long reader makes
-- every statement of the fleet queue behind it; given up at this bound, it lets them through and
-- tries again later.
SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', $1, true),
    set_config('idle_in_transaction_session_timeout', '0', true);

-- name: migration_lock
-- Held to the end of the migrating transaction, so that two migrations never run at once (nor
-- race on CREATE SCHEMA). Tried, never waited for: a session waiting for a lock holds a snapshot,
-- which an index build CONCURRENTLY waits for in turn (the other migration tries again later, as
-- for a table's lock).
SELECT pg_try_advisory_xact_lock($1);

-- name: index_build_lock
-- The lock of a session building an index outside a transaction, held until the driver closes
-- it once the migration is recorded (a killed migrate's goes with its session, once the server
-- has ended what it was running). Another key than the migration lock's: 0.1 waits for that one
-- without a bound, and a build would wait for 0.1's wait.
SELECT pg_try_advisory_lock($1);

-- name: index_session
-- A session building an index outside a transaction: no statement timeout, and its lock waits
-- ($1) bounded by what is left of the migration's --wait. A build CONCURRENTLY waits for every
-- transaction older than it, but blocks nobody while it waits.
SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', $1, false);

-- name: advisory_lock_holders
-- Who holds an advisory lock of ours ($1, $2: its key's high and low 32 bits, as pg_locks shows a
-- bigint key; $3 what it is called): another `jobs-trio migrate`, or a worker migrating as it
-- opens.
SELECT a.pid, a.application_name, a.usename, a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS open_for,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 160) AS query,
       $3::text AS locks, false AS waiting
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = $1::bigint::oid AND l.objid = $2::bigint::oid;

-- name: snapshot_holders
-- Who an index build CONCURRENTLY waited for until its lock timeout ($2 seconds): it waits for
-- each transaction of the database that began before its phases did and holds a snapshot or
-- wrote (a report, a pg_dump), and for those holding a lock on this schema's tables ($1).
SELECT a.pid, a.application_name, a.usename, a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS open_for,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 160) AS query,
       'a transaction older than the build' AS locks, false AS waiting
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.xact_start <= clock_timestamp() - make_interval(secs => $2)
  AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL OR EXISTS (
      SELECT FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
      JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE l.pid = a.pid AND l.locktype = 'relation' AND n.nspname = $1))
ORDER BY a.xact_start
LIMIT 5;

-- name: table_bytes
-- A table's size on disk ($1: its qualified name), NULL when there is no such table.
SELECT pg_relation_size(to_regclass($1));

-- name: index_valid
-- Whether an index is usable ($1: its qualified name): NULL when there is none; false when a
-- build CONCURRENTLY was cut (a cancel, a lock timeout, a killed session) and left it INVALID.
SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1);

-- name: drop_index
DROP INDEX IF EXISTS {schema}.{index};

-- name: drop_index_concurrently
DROP INDEX CONCURRENTLY IF EXISTS {schema}.{index};

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_migrations_table
-- 0.1's record, which 0.1 checks strictly and forever (_schema_compatibility.MARK_FOR_0_1):
-- the migrations it knows (0001-0010), and a mark past them once the level passes 1.
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version integer PRIMARY KEY,
    applied_at double precision NOT NULL
);

-- name: create_schema_history
-- The full record, from 0.2 on: every migration applied, the schema's compatibility level once
-- it was, and the release that applied it. A release reads the level here, not the numbers.
CREATE TABLE IF NOT EXISTS {schema}.schema_history (
    version integer PRIMARY KEY,
    name text NOT NULL,
    level integer NOT NULL,
    applied_at double precision NOT NULL,
    applied_by text NOT NULL
);

-- name: records_exist
-- 0.1's record and the history ($1, $2: their qualified names): a schema 0.1 migrated has no
-- history yet, one never migrated has neither.
SELECT to_regclass($1) IS NOT NULL AS record, to_regclass($2) IS NOT NULL AS history;

-- name: read_record
SELECT version, applied_at FROM {schema}.migrations;

-- name: read_history
SELECT version, name, level, applied_at, applied_by FROM {schema}.schema_history;

-- name: record_history
INSERT INTO {schema}.schema_history (version, name, level, applied_at, applied_by)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (version) DO NOTHING;

-- name: record_migration
INSERT INTO {schema}.migrations (version, applied_at) VALUES ($1, $2)
ON CONFLICT (version) DO NOTHING;

-- name: forget_for_0_1
-- What 0.1's record must not hold for 0.1 to start: the migrations it does not know ($1: its
-- newest), once the history has them, and a mark for a level the schema is no longer at.
DELETE FROM {schema}.migrations WHERE version > $1 AND version <> $2;

-- name: lock_holders
-- Who held the locks a statement waited for until its lock timeout: the sessions with a lock on
-- a table of this schema whose transaction (or, queued, whose statement) began before that wait
-- did, $2 seconds ago. A worker's own transactions last milliseconds and are left out.
SELECT a.pid, a.application_name, a.usename, a.state,
       extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS open_for,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 160) AS query,
       string_agg(DISTINCT c.relname || ' ' || l.mode || CASE WHEN l.granted THEN ''
                  ELSE ' (waiting)' END, ', ') AS locks,
       bool_and(NOT l.granted) AS waiting
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND c.relkind IN ('r', 'p') AND n.nspname = $1
  AND l.pid <> pg_backend_pid()
  AND CASE WHEN l.granted THEN a.xact_start ELSE a.query_start END
      <= clock_timestamp() - make_interval(secs => $2)
GROUP BY a.pid, a.application_name, a.usename, a.state, a.xact_start, a.query
ORDER BY a.xact_start
LIMIT 5;

-- name: drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- Cron tasks (advance_task runs these in one transaction with the fires' enqueue).
