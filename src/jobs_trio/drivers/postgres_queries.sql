-- Every statement the PostgreSQL driver runs, by name. `{schema}` is the driver's schema (a
-- checked identifier, quoted), `{job_columns}` the columns of a JobRecord (never the token).
-- `$1` is the driver clock's now wherever a statement needs the time.

-- name: enqueue
-- New jobs in the caller's order. A key a live job already holds turns its row into a no-op:
-- the partial unique index decides, so two racing enqueues cannot both win. The queues that
-- gained a job are notified in the same statement (delivered at commit: a rolled-back
-- enqueue wakes nobody).
WITH created AS (
    INSERT INTO {schema}.jobs (
        id, name, queue, state, payload, priority, attempts, max_attempts,
        run_at, created_at, updated_at, key
    )
    SELECT n.id, n.name, n.queue, 'ready', n.payload, n.priority, 0, n.max_attempts,
           $1 + greatest(n.delay, 0), $1, $1, n.key
    FROM unnest(
        $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::float8[],
        $9::text[]
    ) WITH ORDINALITY AS n(id, name, queue, payload, priority, max_attempts, delay, key, ord)
    ORDER BY n.ord
    ON CONFLICT (key) WHERE key IS NOT NULL AND state IN ('ready', 'running', 'suspended', 'parked')
    DO NOTHING
    RETURNING id, queue
), notified AS (
    SELECT pg_notify($10, queue) FROM (SELECT DISTINCT queue FROM created) AS woken
)
SELECT id FROM created, (SELECT count(*) FROM notified) AS sent;

-- name: live_key_holders
SELECT key, id FROM {schema}.jobs
WHERE key = ANY($1::text[]) AND state IN ('ready', 'running', 'suspended', 'parked');

-- name: notify
-- One notification per queue that gained claimable work; sent at commit, so a rolled-back
-- enqueue wakes nobody.
SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q;

-- name: claim
-- Due jobs and lapsed leases, best first, skipping rows another claimer holds. A lapsed job
-- with no attempts left is not claimed: it is returned flagged `exhausted` (locked, but not
-- yet changed) so the caller can dead-letter it with its message.
-- Each queue's due jobs are read in claim order straight off jobs_waiting and stop after
-- $3 rows (one OR over both kinds of candidate made PostgreSQL read and sort EVERY waiting
-- row: 35 ms a claim with 20,000 queued). The driver's connections run with enable_sort off
-- (postgres_bridge.POOL_SETTINGS), so that without fresh statistics (a batch just enqueued)
-- the planner still walks that index.
WITH candidates AS MATERIALIZED (
    SELECT c.id FROM (
        SELECT w.id, w.priority, w.run_at
        FROM unnest($2::text[]) AS q(name)
        CROSS JOIN LATERAL (
            SELECT id, priority, run_at FROM {schema}.jobs
            WHERE queue = q.name AND state IN ('ready', 'suspended') AND run_at <= $1
            ORDER BY priority, run_at, id
            LIMIT $3
            FOR UPDATE SKIP LOCKED
        ) AS w
        UNION ALL
        SELECT l.id, l.priority, l.run_at FROM (
            SELECT id, priority, run_at FROM {schema}.jobs
            WHERE queue = ANY($2::text[])
              AND state = 'running' AND lease_until <= $1 AND attempts < max_attempts
            ORDER BY priority, run_at, id
            LIMIT $3
            FOR UPDATE SKIP LOCKED
        ) AS l
    ) AS c
    ORDER BY c.priority, c.run_at, c.id
    LIMIT $3
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        lease_until = $1::float8 + $4::float8,
        worker_id = $5,
        token = gen_random_uuid()::text,
        -- SET reads the row as it was: a job still 'running' here had its lease lapse.
        last_error = CASE WHEN j.state = 'running' THEN $6 ELSE j.last_error END,
        wait_event = NULL,
        updated_at = $1
    FROM candidates AS c
    WHERE j.id = c.id
    RETURNING j.id, j.token, j.name, j.queue, j.payload, j.attempts, j.max_attempts,
              j.lease_until, j.priority, j.run_at
), exhausted AS MATERIALIZED (
    SELECT id, attempts, priority, run_at FROM {schema}.jobs
    WHERE queue = ANY($2::text[])
      AND state = 'running' AND lease_until <= $1 AND attempts >= max_attempts
    FOR UPDATE SKIP LOCKED
)
SELECT false AS exhausted, id, token, name, queue, payload, attempts, max_attempts,
       lease_until, priority, run_at
FROM claimed
UNION ALL
SELECT true, id, NULL, NULL, NULL, NULL, attempts, NULL, NULL, priority, run_at
FROM exhausted
ORDER BY priority, run_at, id;

-- name: bury_lapsed
-- Dead-letter lapsed jobs that used up their attempts; the conditions are checked again
-- because the claim that found them has committed and let go of its locks.
UPDATE {schema}.jobs AS j
SET state = 'dead', token = NULL, lease_until = NULL, worker_id = NULL,
    last_error = d.error, updated_at = $1
FROM unnest($2::text[], $3::text[]) AS d(id, error)
WHERE j.id = d.id
  AND j.state = 'running' AND j.lease_until <= $1 AND j.attempts >= j.max_attempts;

-- name: renew
-- Lock in id order first: a worker renews and settles on two connections at once, and two
-- statements locking the same rows in different orders would deadlock.
WITH held AS MATERIALIZED (
    SELECT j.id FROM {schema}.jobs AS j
    JOIN unnest($3::text[], $4::text[]) AS l(id, token) ON j.id = l.id AND j.token = l.token
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE {schema}.jobs AS j
SET lease_until = $1::float8 + $2::float8, updated_at = $1
FROM held AS h
WHERE j.id = h.id
RETURNING j.token, j.cancel_requested;

-- name: lock_for_settle
-- A batch of several kinds runs one statement per kind in one transaction: lock all its rows in
-- id order first, or two kinds' statements could take them in an order a renew crosses.
SELECT id FROM {schema}.jobs WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE;

-- name: settle
-- The frame of every kind's settle statement: settle_<kind>_rows below is the unnest of the
-- batch, settle_<kind>_set what that kind changes. Fenced: only a row whose token is still the
-- claim's changes. $1 now, $2 the NOTIFY channel, $3 ids, $4 tokens, $5… the kind's own.
WITH locked AS MATERIALIZED (
    -- In id order: a worker renews and settles on two connections at once (see renew).
    SELECT id FROM {schema}.jobs WHERE id = ANY($3::text[]) ORDER BY id FOR UPDATE
), settled AS (
    UPDATE {schema}.jobs AS j
    SET {kind_set},
        token = NULL, lease_until = NULL, worker_id = NULL, cancel_requested = false,
        updated_at = $1
    FROM ({kind_rows}) AS s
    WHERE j.id = s.id AND j.token = s.token AND j.state = 'running'
      AND j.id IN (SELECT id FROM locked)
    RETURNING j.id, j.queue, s.ready_now
), notified AS (
    -- A job ready again at once (an interrupted attempt, a drain) is for any worker to take.
    SELECT pg_notify($2, queue) FROM (SELECT DISTINCT queue FROM settled WHERE ready_now) AS w
)
SELECT id FROM settled, (SELECT count(*) FROM notified) AS sent;

-- name: settle_complete_rows
SELECT *, false AS ready_now
FROM unnest($3::text[], $4::text[], $5::text[]) AS u(id, token, result);

-- name: settle_complete_set
state = 'completed', result = s.result;

-- name: settle_retry_rows
SELECT *, delay <= 0 AS ready_now
FROM unnest($3::text[], $4::text[], $5::float8[], $6::text[], $7::bool[])
    AS u(id, token, delay, error, counted);

-- name: settle_retry_set
-- counted = false hands the attempt back (an interrupted run).
state = 'ready', run_at = $1 + greatest(s.delay, 0),
attempts = j.attempts - CASE WHEN s.counted THEN 0 ELSE 1 END,
last_error = s.error;

-- name: settle_dead_rows
SELECT *, false AS ready_now FROM unnest($3::text[], $4::text[], $5::text[]) AS u(id, token, error);

-- name: settle_dead_set
state = 'dead', last_error = s.error;

-- name: settle_suspend_rows
SELECT *, delay <= 0 AS ready_now
FROM unnest($3::text[], $4::text[], $5::float8[], $6::text[]) AS u(id, token, delay, event);

-- name: settle_suspend_set
-- A suspension hands its attempt back: waiting is not failing.
state = 'suspended', run_at = $1 + greatest(s.delay, 0), attempts = j.attempts - 1,
wait_event = s.event;

-- name: settle_park_rows
SELECT *, false AS ready_now FROM unnest($3::text[], $4::text[], $5::text[]) AS u(id, token, reason);

-- name: settle_park_set
-- Parked for deploy skew (a job name this deploy does not know): the attempt is handed back.
state = 'parked', attempts = j.attempts - 1, last_error = s.reason;

-- name: settle_cancel_rows
SELECT *, false AS ready_now FROM unnest($3::text[], $4::text[], $5::text[]) AS u(id, token, error);

-- name: settle_cancel_set
state = 'cancelled', last_error = s.error;

-- name: get_job
SELECT {job_columns} FROM {schema}.jobs WHERE id = $1;

-- name: lock_job
SELECT {job_columns} FROM {schema}.jobs WHERE id = $1 FOR UPDATE;

-- name: list_jobs
SELECT {job_columns} FROM {schema}.jobs
WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR queue = $2)
ORDER BY created_at DESC, id DESC
LIMIT $3;

-- name: key_held_elsewhere
SELECT EXISTS (
    SELECT 1 FROM {schema}.jobs
    WHERE key = $1 AND id <> $2 AND state IN ('ready', 'running', 'suspended', 'parked')
);

-- name: retry_job
UPDATE {schema}.jobs
SET state = 'ready', run_at = $1, attempts = 0, cancel_requested = false, updated_at = $1
WHERE id = $2
RETURNING {job_columns};

-- name: request_cancel
-- A running job is only flagged: its worker hears it at the next renewal and cancels the run.
UPDATE {schema}.jobs SET cancel_requested = true, updated_at = $1 WHERE id = $2
RETURNING {job_columns};

-- name: cancel_job
UPDATE {schema}.jobs SET state = 'cancelled', last_error = $3, updated_at = $1 WHERE id = $2
RETURNING {job_columns};

-- name: stats
SELECT queue, state, count(*)::int AS n,
       count(*) FILTER (WHERE state = 'ready' AND run_at <= $1)::int AS due,
       min(run_at) FILTER (WHERE state = 'ready' AND run_at <= $1) AS oldest_due
FROM {schema}.jobs
GROUP BY queue, state
ORDER BY queue;

-- name: next_due
-- The earliest moment a job in these queues may become claimable: a run-at, or a lease that
-- will lapse. least() skips NULLs; NULL overall means nothing is coming.
SELECT least(
    (SELECT min(run_at) FROM {schema}.jobs
     WHERE queue = ANY($1::text[]) AND state IN ('ready', 'suspended')),
    (SELECT min(lease_until) FROM {schema}.jobs
     WHERE queue = ANY($1::text[]) AND state = 'running')
);

-- name: load_steps
SELECT name, status, started_at, finished_at, result, wake_at, event, match_key
FROM {schema}.steps WHERE job_id = $1 ORDER BY position;

-- name: save_step
-- Fenced: written only while the token is current. FOR SHARE holds off a concurrent claim or
-- settle until this write lands, so it cannot slip in just after the token changed.
WITH held AS (
    SELECT id FROM {schema}.jobs
    WHERE id = $1 AND token = $2 AND state = 'running'
    FOR SHARE
)
INSERT INTO {schema}.steps AS s (
    job_id, name, status, started_at, finished_at, result, wake_at, event, match_key
)
SELECT id, $3, $4, $5, $6, $7, $8, $9, $10 FROM held
ON CONFLICT (job_id, name) DO UPDATE
SET status = excluded.status, started_at = excluded.started_at,
    finished_at = excluded.finished_at, result = excluded.result, wake_at = excluded.wake_at,
    event = excluded.event, match_key = excluded.match_key
RETURNING s.job_id;

-- name: send_event
-- Store the event and make every job suspended on its name ready now; notify their queues.
WITH event AS (
    INSERT INTO {schema}.events (name, key, payload, created_at) VALUES ($2, $3, $4, $1)
    RETURNING id
), woken AS (
    UPDATE {schema}.jobs SET state = 'ready', run_at = $1, updated_at = $1
    WHERE state = 'suspended' AND wait_event = $2
    RETURNING queue
), notified AS (
    SELECT pg_notify($5, queue) FROM (SELECT DISTINCT queue FROM woken) AS q
)
SELECT (SELECT id FROM event) AS id, (SELECT count(*) FROM notified) AS sent;

-- name: find_event
SELECT id, name, key, payload, created_at FROM {schema}.events
WHERE name = $1 AND ($2::text IS NULL OR key = $2) AND ($3::float8 IS NULL OR created_at >= $3)
ORDER BY id
LIMIT 1;

-- name: migration_lock
-- Held to the end of the migrating transaction: concurrent `jobs-trio migrate` runs queue up
-- here instead of racing on CREATE SCHEMA.
SELECT pg_advisory_xact_lock($1);

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version integer PRIMARY KEY,
    applied_at double precision NOT NULL
);

-- name: migrations_table_exists
SELECT to_regclass($1) IS NOT NULL;

-- name: applied_versions
SELECT version FROM {schema}.migrations ORDER BY version;

-- name: record_migration
INSERT INTO {schema}.migrations (version, applied_at) VALUES ($1, $2);

-- name: drop_schema
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: enqueue_once
-- The relay's enqueue: like `enqueue`, but a job whose id is already stored (relayed before, by
-- a relay that died before deleting its outbox row, or by another relay) is a no-op too. No
-- conflict target: the primary key and the live-key index both turn a row into a no-op.
WITH created AS (
    INSERT INTO {schema}.jobs (
        id, name, queue, state, payload, priority, attempts, max_attempts,
        run_at, created_at, updated_at, key
    )
    SELECT n.id, n.name, n.queue, 'ready', n.payload, n.priority, 0, n.max_attempts,
           $1 + greatest(n.delay, 0), $1, $1, n.key
    FROM unnest(
        $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::float8[],
        $9::text[]
    ) WITH ORDINALITY AS n(id, name, queue, payload, priority, max_attempts, delay, key, ord)
    ORDER BY n.ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue
), notified AS (
    SELECT pg_notify($10, queue) FROM (SELECT DISTINCT queue FROM created) AS woken
)
SELECT id FROM created, (SELECT count(*) FROM notified) AS sent;

-- name: stored_ids
SELECT id FROM {schema}.jobs WHERE id = ANY($1::text[]);

-- name: outbox_write
-- In the application's transaction (a savepoint in it): the rows exist once it commits.
INSERT INTO {schema}.outbox (
    id, name, queue, payload, priority, max_attempts, key, run_at, created_at
)
SELECT n.id, n.name, n.queue, n.payload, n.priority, n.max_attempts, n.key,
       $1 + greatest(n.delay, 0), $1
FROM unnest(
    $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[], $8::float8[],
    $9::text[]
) WITH ORDINALITY AS n(id, name, queue, payload, priority, max_attempts, delay, key, ord)
ORDER BY n.ord;

-- name: outbox_claim
-- Oldest first, skipping rows another relay is taking right now (SKIP LOCKED) or holds under a
-- live lease; a lapsed hold (its relay died) is taken again. $1 now, $2 lease, $3 limit,
-- $4 relay id.
WITH taken AS (
    SELECT seq FROM {schema}.outbox
    WHERE claimed_until IS NULL OR claimed_until <= $1
    ORDER BY seq
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox AS o
SET claimed_until = $1::float8 + $2::float8, relay_id = $4
FROM taken
WHERE o.seq = taken.seq
RETURNING o.seq, o.id, o.name, o.queue, o.payload, o.priority, o.max_attempts, o.key, o.run_at;

-- name: outbox_delete
WITH gone AS (
    DELETE FROM {schema}.outbox WHERE id = ANY($1::text[]) RETURNING 1
)
SELECT count(*)::int FROM gone;

-- name: outbox_stats
SELECT count(*)::int AS pending, min(created_at) AS oldest FROM {schema}.outbox;
