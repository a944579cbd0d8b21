-- The fleet capability's statements (_fleet.py): workers' presence, pauses, the shared stats.
-- Placeholders and the loading: _postgres_sql.py.

-- name: worker_seen
WITH forgotten AS (
    DELETE FROM {schema}.workers WHERE seen_at < $12 AND worker_id <> $1
)
INSERT INTO {schema}.workers
    (worker_id, host, pid, queues, concurrency, running, state, version, started_at, seen_at,
     every, jobs)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $13)
ON CONFLICT (worker_id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, queues = excluded.queues,
    concurrency = excluded.concurrency, running = excluded.running, state = excluded.state,
    version = excluded.version, started_at = excluded.started_at, seen_at = excluded.seen_at,
    every = excluded.every, jobs = excluded.jobs;

-- name: worker_gone
DELETE FROM {schema}.workers WHERE worker_id = $1;

-- name: workers
SELECT worker_id, host, pid, queues, concurrency, running, state, version, started_at, seen_at,
       every, jobs
FROM {schema}.workers ORDER BY worker_id;

-- name: paused_queues
SELECT queue, paused_at, paused_by, coalesce(epoch, 0) AS epoch
FROM {schema}.queue_pauses ORDER BY queue;

-- name: pause_look
-- The epoch and the pauses in one statement, so of one snapshot: an epoch's changes commit in
-- its order (each waits for the previous one's row lock on pause_epoch), so a snapshot that
-- has epoch N has every change up to N, and none after.
SELECT e.epoch, p.queue, p.paused_at, p.paused_by, coalesce(p.epoch, 0) AS paused_epoch
FROM {schema}.pause_epoch AS e LEFT JOIN {schema}.queue_pauses AS p ON true
WHERE e.id = 1
ORDER BY p.queue;

-- name: pause_lock
-- Before the pause's write, in its transaction: waits for every claim that read the pauses
-- before it to end, and holds off every claim after it until the pause commits, when the claim
-- takes its snapshot (a statement's snapshot is taken once its locks are held) and sees it.
-- Bounded by the pool's lock_timeout, as every wait for a lock is.
LOCK TABLE {schema}.queue_pauses IN ACCESS EXCLUSIVE MODE;

-- name: pause_queue
-- The pause, or the one on record; a new one counts the next epoch and is notified (at
-- commit) to the workers' watch on the pauses.
WITH bumped AS (
    UPDATE {schema}.pause_epoch SET epoch = epoch + 1
    WHERE id = 1 AND NOT EXISTS (SELECT 1 FROM {schema}.queue_pauses WHERE queue = $1)
    RETURNING epoch
), paused AS (
    INSERT INTO {schema}.queue_pauses (queue, paused_at, paused_by, epoch)
    SELECT $1, $2, $3, epoch FROM bumped
    RETURNING queue, paused_at, paused_by, epoch
), notified AS (
    SELECT pg_notify($4, $5) FROM paused
)
SELECT queue, paused_at, paused_by, coalesce(epoch, 0) AS epoch
FROM {schema}.queue_pauses, (SELECT count(*) FROM notified) AS n
WHERE queue = $1
UNION ALL
SELECT queue, paused_at, paused_by, epoch FROM paused, (SELECT count(*) FROM notified) AS n;

-- name: resume_queue
-- The pause taken back, counting the next epoch; its queue's waiters for work and the watch on
-- the pauses notified.
WITH resumed AS (
    DELETE FROM {schema}.queue_pauses WHERE queue = $1 RETURNING queue
), bumped AS (
    UPDATE {schema}.pause_epoch SET epoch = epoch + 1
    WHERE id = 1 AND EXISTS (SELECT 1 FROM resumed)
    RETURNING epoch
), notified AS (
    SELECT pg_notify($2, payload) FROM resumed, unnest(ARRAY[resumed.queue, $3]) AS payload
)
SELECT count(*) AS resumed, (SELECT count(*) FROM notified) AS sent,
       (SELECT count(*) FROM bumped) AS bumped
FROM resumed;

-- name: pauses_heard
-- A worker's confirmation, the confirmations of workers long silent forgotten (as worker_seen).
WITH forgotten AS (
    DELETE FROM {schema}.pauses_heard WHERE heard_at < $4 AND worker_id <> $1
)
INSERT INTO {schema}.pauses_heard (worker_id, epoch, heard_at) VALUES ($1, $2, $3)
ON CONFLICT (worker_id) DO UPDATE SET epoch = excluded.epoch, heard_at = excluded.heard_at;

-- name: pause_holders
-- The workers with running jobs of a queue (jobs_leased, the running jobs by queue), and the
-- epoch each confirmed.
SELECT j.worker_id, count(*)::int AS jobs, max(coalesce(j.lease_until, 0)) AS lease_until,
       h.epoch AS heard
FROM {schema}.jobs AS j LEFT JOIN {schema}.pauses_heard AS h ON h.worker_id = j.worker_id
WHERE j.queue = $1 AND j.state = 'running' AND j.worker_id IS NOT NULL
GROUP BY j.worker_id, h.epoch
ORDER BY j.worker_id;

-- name: fleet_stats_turn
-- The compare-and-set that gives one worker per interval ($3 seconds) the full stats read
-- (_fleet_stats.py); every caller gets the stored observation with it (the row as it was before
-- the UPDATE: the same snapshot), which a caller that took the turn replaces.
WITH turn AS (
    UPDATE {schema}.fleet_stats SET taken_at = $1::float8, worker_id = $2
    WHERE id = 1 AND (taken_at IS NULL OR taken_at <= $1::float8 - $3::float8)
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM turn) AS mine, observed FROM {schema}.fleet_stats WHERE id = 1;

-- name: fleet_stats_store
UPDATE {schema}.fleet_stats SET observed = $1 WHERE id = 1;
