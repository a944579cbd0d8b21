-- The admin capability's statements (_admin.py): reads, operator transitions, stats, pruning.
-- Placeholders and the loading: _postgres_sql.py.

-- name: get_job
SELECT {job_columns} FROM {schema}.jobs WHERE id = $1;

-- name: lock_job
SELECT {job_columns} FROM {schema}.jobs WHERE id = $1 FOR UPDATE;

-- name: list_jobs
SELECT {job_columns} FROM {schema}.jobs
WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR queue = $2)
  AND ($4::text IS NULL OR name = $4) AND ($5::float8 IS NULL OR updated_at < $5)
ORDER BY created_at DESC, id DESC
LIMIT $3;

-- name: load_attempts
SELECT seq, attempt, outcome, worker_id, seconds, ended_at, error, traceback
FROM {schema}.attempts WHERE job_id = $1 ORDER BY seq;

-- name: outcome_counts
-- One range read of attempts_ended, whatever the number of queues or jobs.
SELECT floor(ended_at / $2) * $2 AS start, outcome, count(*)::int AS n
FROM {schema}.attempts WHERE ended_at >= $1
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: name_stats
-- One range read of attempts_ended, joined to each attempt's job for its name.
SELECT j.name, a.outcome, count(*)::int AS n, count(a.seconds)::int AS timed,
       sum(a.seconds) AS seconds, max(a.seconds) AS longest
FROM {schema}.attempts AS a JOIN {schema}.jobs AS j ON j.id = a.job_id
WHERE a.ended_at >= $1
GROUP BY j.name, a.outcome;

-- name: key_held_elsewhere
SELECT EXISTS (
    SELECT 1 FROM {schema}.jobs
    WHERE key = $1 AND id <> $2 AND state IN {live_states}
);

-- name: retry_job
UPDATE {schema}.jobs
SET state = 'ready', run_at = $1, attempts = 0, ahead_lapses = 0, orphans = 0,
    cancel_requested = false,
    waiting_on = NULL, updated_at = $1
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

-- name: delete_job
-- After lock_job and the check (a job not running): its step records go with it (ON DELETE
-- CASCADE), and its attempt history here (no key references the job since 0030). The row is
-- locked and not running: no settle records an attempt of it meanwhile.
WITH history AS (DELETE FROM {schema}.attempts WHERE job_id = $1)
DELETE FROM {schema}.jobs WHERE id = $1;

-- name: run_now
UPDATE {schema}.jobs SET run_at = $1, updated_at = $1 WHERE id = $2
RETURNING {job_columns};

-- name: limit_waiting
-- Jobs a claim put off for a fleet limit, by queue, job and kind ('slot' or 'rate').
SELECT queue, name, split_part(waiting_on, ':', 1) AS kind, count(*)::int AS n
FROM {schema}.jobs
WHERE waiting_on IS NOT NULL AND state IN {waiting_states}
GROUP BY queue, name, kind
ORDER BY queue, name, kind;

-- name: prune_turn_read
-- The fleet's one prune turn (retention.py), locked for the batch's transaction. SKIP LOCKED:
-- a pruner that finds another mid-batch gets no row and goes away (the turn is taken), rather
-- than queue behind it on the lock.
SELECT holder, held_until, ended_at FROM {schema}.prune_turn WHERE id = 1 FOR UPDATE SKIP LOCKED;

-- name: prune_batch
-- Up to $3 finished jobs: completed and cancelled ones last changed before $1, dead ones before
-- $2 (NULL: kept). Each arm reads the partial index jobs_finished oldest first and stops at the
-- limit. The DELETE repeats the state test: a job an operator re-ran since is live again, and
-- the row's new version fails it. Step records go with their job (ON DELETE CASCADE);
-- its attempt history, by prune_history after it.
WITH doomed AS (
    (SELECT id FROM {schema}.jobs WHERE state = 'completed' AND updated_at < $1::float8
        ORDER BY updated_at LIMIT $3)
    UNION ALL
    (SELECT id FROM {schema}.jobs WHERE state = 'cancelled' AND updated_at < $1::float8
        ORDER BY updated_at LIMIT $3)
    UNION ALL
    (SELECT id FROM {schema}.jobs WHERE state = 'dead' AND updated_at < $2::float8
        ORDER BY updated_at LIMIT $3)
    LIMIT $3
)
DELETE FROM {schema}.jobs AS j USING doomed
WHERE j.id = doomed.id AND j.state IN ('completed', 'cancelled', 'dead')
RETURNING j.id;

-- name: prune_history
-- The attempt history of the jobs prune_batch deleted ($1), in its transaction. A statement of
-- its own, not a CTE of the batch: its snapshot is newer than the batch's, so it also sees the
-- record of an attempt that ended while the batch waited for its job's row (re-run by an
-- operator, ended again); the rows are deleted now, so no attempt of them ends after it.
DELETE FROM {schema}.attempts WHERE job_id = ANY($1::text[]);

-- name: prune_turn_hold
UPDATE {schema}.prune_turn SET holder = $1, held_until = $2::float8 WHERE id = 1;

-- name: prune_turn_end
UPDATE {schema}.prune_turn SET holder = NULL, held_until = NULL, ended_at = $1::float8 WHERE id = 1;
